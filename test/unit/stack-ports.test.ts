import { readFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { describe, expect, it } from 'vitest';
import { freePort } from '../../deploy/local/stack.js';

const ephemeralLow = (): number | null => {
  try {
    return Number(readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/)[0]);
  } catch {
    return null;
  }
};

describe('freePort', () => {
  it('never hands out a port twice, each one bindable, below the range outgoing connections take theirs from', async () => {
    const ports: number[] = [];
    for (let i = 0; i < 300; i++) ports.push(await freePort());
    expect(new Set(ports).size).toBe(ports.length);
    const low = ephemeralLow();
    if (low !== null && low > 11_000) for (const p of ports) expect(p).toBeLessThan(low);
    for (const p of ports.slice(0, 20)) {
      const s = createServer();
      await new Promise<void>((r, j) => s.once('error', j).listen(p, '127.0.0.1', r));
      await new Promise((r) => s.close(r));
    }
  });
});
