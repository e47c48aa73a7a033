import type { Producer } from 'kafkajs';

/**
 * A producer double: the tests that use it are about the publisher (its step count, its memory, who hears of a
 * failure), not about Kafka. It refuses the next `failures` sends ('broker down'; Infinity: every one) and keeps
 * the events of the others, parsed, in `sent`, in send order. `framing` is how many bytes come before each
 * event's JSON (5 with a schema registry: the magic byte and the schema id).
 */
export function producerDouble<T = Record<string, unknown>>(framing = 0) {
  const double = {
    sent: [] as T[],
    failures: 0,
    producer: {
      send: async (r: { messages: { value: Buffer }[] }) => {
        if (double.failures > 0) {
          double.failures--;
          throw new Error('broker down');
        }
        for (const m of r.messages) double.sent.push(JSON.parse(m.value.subarray(framing).toString()) as T);
        return [];
      },
    } as unknown as Producer,
  };
  return double;
}
