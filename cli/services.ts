/** The services `paver run NAME` can start; each module exports `service` (a ServiceSpec). */
export const SERVICES = {
  detector: {
    port: 9101,
    summary: 'repeated tool sequences → flow candidates',
    load: () => import('../services/detector/src/main.js'),
  },
  autoseq: {
    port: 9102,
    summary: 'unique typed next tool → next-action events',
    load: () => import('../services/autoseq/src/main.js'),
  },
  sequencer: {
    port: 9103,
    summary: 'per-session tool sequences → allowed tools',
    load: () => import('../services/sequencer/src/main.js'),
  },
  flows: {
    port: 9104,
    summary: 'candidates → flow registry; flow selection per request',
    load: () => import('../services/flows/src/main.js'),
  },
  ingest: {
    port: 9105,
    summary: 'OpenTelemetry GenAI spans (OTLP topic) → tool-calls events',
    load: () => import('../services/ingest/src/main.js'),
  },
} as const;

export const PLANNED_SERVICES: readonly string[] = [];

export type ServiceName = keyof typeof SERVICES;
export const isServiceName = (s: string): s is ServiceName => Object.hasOwn(SERVICES, s);
