import type { Kafka } from 'kafkajs';
import type { ToolCallsEvent } from '../../../../schemas/index.js';
import type { Codec } from '../../../../shared/codec.js';
import { decodeMessage, type Parser } from '../../../../shared/kafka/decode.js';
import { readRanges, type ReplayOptions } from '../../../../shared/kafka/replay.js';
import type { Logger } from '../../../../shared/log.js';
import { aheadOfRecord, toOp, type DetectorOp } from '../core/ops.js';
import type { PartitionReplay } from './rebuild.js';

export interface ReplayDeps {
  /** The tool-calls topic's replay reader. */
  input: ReplayOptions;
  /** As the live path decodes: its codec, contract and PAVER_MAX_MESSAGE_BYTES. */
  codec: Codec;
  parse: Parser<ToolCallsEvent>;
  maxBytes: number;
  /** PAVER_BATCH_CHUNK. */
  chunk: number;
  /** DETECTOR_MAX_AHEAD_MS. */
  maxAheadMs: number;
  requestTerms: boolean;
  log: Logger;
}

/** A rebuild's replay of one tool-calls partition, as the ops the live path would have applied. */
export function createPartitionReplay(d: ReplayDeps): PartitionReplay {
  const decode = { codec: d.codec, parse: d.parse, maxBytes: d.maxBytes };
  return async (partition, from, end, each, goOn) => {
    const { lowWatermarks } = await readRanges(
      d.input,
      new Map([[partition, { from: from ?? 0n, end }]]),
      async (_p, messages) => {
        // Applied PAVER_BATCH_CHUNK messages at a time, as the live path applies them: a script call per scope
        // and chunk is what REDIS_COMMAND_TIMEOUT_MS is set to outlast, and a fetched batch may be far larger.
        for (let i = 0; i < messages.length; i += d.chunk) {
          const chunk = messages.slice(i, i + d.chunk);
          const ops: DetectorOp[] = [];
          for (const m of chunk) {
            if (m.value === null) continue;
            // Decoded as the live path decodes (size, depth, contract): what it dead-lettered made no state then
            // either. A registry that does not answer throws, and the rebuild is tried again; before, such a
            // message was skipped as if dead-lettered, and one the live path dead-lettered for its size or depth
            // was applied.
            const decoded = await decodeMessage(m, d.input.topic, decode);
            if (!decoded.ok) continue;
            // Ignored when first read (counted then): ignored again, so the rebuilt state is the one it was.
            if (aheadOfRecord(decoded.value.ts, m.timestamp, d.maxAheadMs)) continue;
            const op = toOp(decoded.value, d.requestTerms, partition, m.offset);
            if (op) ops.push(op);
          }
          await each(ops, chunk.length);
        }
      },
      goOn,
    );
    const low = lowWatermarks.get(partition) ?? 0n;
    if (from !== null && from < low)
      d.log.error(
        { partition, checkpoint: from.toString(), lowWatermark: low.toString() },
        'rebuild replay starts after its checkpoint: the tool-calls topic no longer retains it (raise its retention); the oldest window records are missing',
      );
  };
}

/**
 * The group's committed offset of one partition of `topic` (null when none is): where a rebuild of a partition
 * with no batch in hand ends. One admin session per call: a call is made only for a partition to rebuild.
 */
export function createCommittedOffset(o: {
  kafka: Kafka;
  groupId: string;
  topic: string;
}): (partition: number) => Promise<bigint | null> {
  return async (partition) => {
    const admin = o.kafka.admin();
    try {
      await admin.connect();
      const [t] = await admin.fetchOffsets({ groupId: o.groupId, topics: [o.topic] });
      const offset = t?.partitions.find((p) => p.partition === partition)?.offset ?? '-1';
      return BigInt(offset) < 0n ? null : BigInt(offset);
    } finally {
      await admin.disconnect().catch(() => undefined);
    }
  };
}
