/** The services `paver run NAME` can start; each module exports `service` (a ServiceSpec). */
export const SERVICES = {
  detector: { port: 9101, summary: 'repeated tool sequences → flow candidates', load: () => import('../services/detector/src/main.js') },
} as const;

export const PLANNED_SERVICES = ['autoseq', 'sequencer', 'flows'] as const;

export type ServiceName = keyof typeof SERVICES;
export const isServiceName = (s: string): s is ServiceName => Object.hasOwn(SERVICES, s);
