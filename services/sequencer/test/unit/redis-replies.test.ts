import { readdirSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { redisFailure } from '../../../../shared/redis/replies.js';
import { parseScriptReply } from '../../../../shared/redis/scripts.js';
import { SCRIPT_DIR, SCRIPTS } from '../../src/adapters/redis/store.js';
import { z } from 'zod';

const replyError = (message: string) => Object.assign(new Error(message), { name: 'ReplyError' });

describe('one Redis reply path', () => {
  it('every Lua file of the sequencer is registered, and every registered name has its file', () => {
    const files = readdirSync(SCRIPT_DIR).filter((f) => f.endsWith('.lua'));
    expect(files.map((f) => f.replace(/-\d+\.lua$/, '')).sort()).toEqual([...SCRIPTS].sort());
  });
  it('connection failures and transient server states are retriable; error replies are bugs', () => {
    const cases: [unknown, string, boolean][] = [
      [Object.assign(new Error('connect ECONNREFUSED'), { code: 'ECONNREFUSED' }), 'REDIS_UNAVAILABLE', true],
      [new Error('Connection is closed.'), 'REDIS_UNAVAILABLE', true],
      [
        Object.assign(new Error('max retries'), { name: 'MaxRetriesPerRequestError' }),
        'REDIS_UNAVAILABLE',
        true,
      ],
      [replyError('LOADING Redis is loading the dataset in memory'), 'REDIS_UNAVAILABLE', true],
      [replyError('BUSY Redis is busy running a script'), 'REDIS_UNAVAILABLE', true],
      [replyError("OOM command not allowed when used memory > 'maxmemory'."), 'REDIS_UNAVAILABLE', true],
      [
        replyError('ERR user_script:3: Script attempted to access nonexistent global variable'),
        'REDIS_SCRIPT_FAILED',
        false,
      ],
      [
        replyError('WRONGTYPE Operation against a key holding the wrong kind of value'),
        'REDIS_SCRIPT_FAILED',
        false,
      ],
      [new TypeError('x is not a function'), 'INTERNAL', false],
    ];
    for (const [err, code, retriable] of cases)
      expect(redisFailure('session write', err), String(err)).toMatchObject({ code, retriable });
    expect(redisFailure('session write', replyError('ERR x')).message).toBe('session write: ERR x');
  });
  it('scripts answer negative codes through parseScriptReply, mapped to the code given', () => {
    const schema = z.tuple([z.literal(1)]);
    expect(parseScriptReply('s', [1], schema)).toEqual([1]);
    expect(() =>
      parseScriptReply('s', [-1, '7'], schema, { [-1]: { code: 'STATE_CONTENDED', message: 'raced' } }),
    ).toThrow(expect.objectContaining({ code: 'STATE_CONTENDED', retriable: true, message: 's: raced (7)' }));
    expect(() => parseScriptReply('s', [-9], schema)).toThrow(
      expect.objectContaining({ code: 'REDIS_SCRIPT_FAILED', retriable: false }),
    );
    expect(() => parseScriptReply('s', 1, schema)).toThrow(
      expect.objectContaining({ code: 'REDIS_SCRIPT_FAILED' }),
    );
  });
});
