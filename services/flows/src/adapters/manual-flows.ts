import type { FlowDefinition, RegisteredFlow } from '../../../../schemas/index.js';
import type { Logger } from '../../../../shared/log.js';
import { manualFlowsGone, registerManualFlows, type FlowRegistry } from '../core/registry.js';

export interface ManualFlowsDeps {
  registry: Pick<FlowRegistry, 'get' | 'all' | 'upsert' | 'remove'>;
  publishFlows: (flows: RegisteredFlow[]) => Promise<void>;
  withdrawFlows: (ids: string[]) => Promise<void>;
  /** Hand-written flows withdrawn because the file no longer defines them (only called with n > 0). */
  onWithdrawn: (n: number) => void;
  log: Logger;
  now: () => number;
}

/**
 * FLOWS_FILE's flows at a start. `loaded`: whether the registry feed read the flows topic to its end before.
 */
export async function syncManualFlows(
  manual: readonly FlowDefinition[],
  loaded: boolean,
  d: ManualFlowsDeps,
): Promise<void> {
  // Hand-written flows join the same registry: published (idempotent by id) so every instance sees them.
  const flows = registerManualFlows(manual, d.registry, d.now());
  if (flows.length) {
    await d.publishFlows(flows);
    for (const f of flows) d.registry.upsert(f);
    d.log.info({ count: flows.length }, 'hand-written flows registered');
  }
  // Only against a registry read to its end: one still loading does not show every flow the file dropped.
  if (loaded) {
    const gone = manualFlowsGone(flows, d.registry.all());
    if (gone.length) {
      await d.withdrawFlows(gone.map((f) => f.id));
      for (const f of gone) d.registry.remove(f.id);
      d.onWithdrawn(gone.length);
      d.log.info({ count: gone.length }, 'hand-written flows no longer in FLOWS_FILE withdrawn');
    }
  } else
    d.log.warn(
      'hand-written flows taken out of FLOWS_FILE are withdrawn at a start that reads the flows topic to its end',
    );
}
