import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { afterAll, describe, expect, it } from 'vitest';
import { defineScripts, readScripts } from '../../shared/redis/scripts.js';

describe('Lua script files', () => {
  // Never connected: defining commands and checking names needs no server.
  const redis = new Redis({ lazyConnect: true });
  afterAll(() => redis.disconnect());

  it('reads a fixed key count from the name, and `-n` as a count given per call', () => {
    const dir = mkdtempSync(join(tmpdir(), 'paver-lua-'));
    writeFileSync(join(dir, 'fixedOne-2.lua'), 'return 1');
    writeFileSync(join(dir, 'anyKeys-n.lua'), 'return #KEYS');
    writeFileSync(join(dir, 'notAScript.txt'), '');
    const files = readScripts(dir, ['fixedOne', 'anyKeys']);
    expect(files.map((f) => [f.name, f.numberOfKeys]).sort()).toEqual([
      ['anyKeys', null],
      ['fixedOne', 2],
    ]);
    expect(() => readScripts(dir, ['missing'])).toThrow(/missing-N\.lua/);
    // A script whose key count changed, its old copy left behind by a build: which one ran would be luck.
    writeFileSync(join(dir, 'fixedOne-n.lua'), 'return 1');
    expect(() => readScripts(dir, ['fixedOne'])).toThrow(/fixedOne is defined twice/);
  });

  it("refuses a script named like a Redis command (ioredis would quietly keep the command's)", () => {
    expect(() => defineScripts(redis, [{ name: 'save', numberOfKeys: 0, lua: 'return 1' }])).toThrow(
      /is taken on the Redis client/,
    );
    defineScripts(redis, [{ name: 'paverOwnScript', numberOfKeys: 0, lua: 'return 1' }]);
    // Defining again (another batch, another store on the same connection) is a no-op.
    expect(() =>
      defineScripts(redis, [{ name: 'paverOwnScript', numberOfKeys: 0, lua: 'return 1' }]),
    ).not.toThrow();
  });
});
