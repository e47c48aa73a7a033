/**
 * Asks `probe` every `everyMs` until it answers true, then calls `onUp`; a false answer or a failure asks again.
 * The dependency watches (Redis, the schema registry) run one while their dependency is taken for down: nothing
 * else calls it meanwhile, consumption being paused. Timers are unref'd: a watch never keeps a process alive.
 */
export function pollUntil(
  probe: () => Promise<boolean>,
  everyMs: number,
  onUp: () => void,
): { stop(): void } {
  let stopped = false;
  let timer: NodeJS.Timeout | null = null;
  const ask = () => {
    timer = setTimeout(() => {
      timer = null;
      if (stopped) return;
      probe().then(
        (up) => (stopped ? undefined : up ? onUp() : ask()),
        () => ask(),
      );
    }, everyMs);
    timer.unref();
  };
  ask();
  return {
    stop() {
      stopped = true;
      if (timer) clearTimeout(timer);
    },
  };
}
