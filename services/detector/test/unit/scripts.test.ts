import { readdirSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { SCRIPT_DIR, SCRIPT_KEYS } from '../../src/adapters/redis/store.js';

describe('detector Lua scripts', () => {
  it('every Lua file is registered with its key count, and every registered script has its file', () => {
    const files = readdirSync(SCRIPT_DIR).filter((f) => f.endsWith('.lua'));
    expect(files.sort()).toEqual(
      Object.entries(SCRIPT_KEYS)
        .map(([name, keys]) => `${name}-${keys}.lua`)
        .sort(),
    );
  });
});
