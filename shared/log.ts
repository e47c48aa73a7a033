import { pino, type Logger } from 'pino';

export type { Logger };

/**
 * Structured JSON logs on stderr (stdout belongs to the offline commands' output). Payload-bearing fields
 * are redacted wherever they appear, as a second line of defence: code must not log them in the first place.
 */
export function createLogger(service: string, level: string = process.env.LOG_LEVEL ?? 'info'): Logger {
  return pino(
    {
      level,
      base: { service },
      redact: {
        paths: [
          'args',
          'observation',
          'text',
          '*.args',
          '*.observation',
          '*.text',
          'password',
          '*.password',
          'apiKey',
          '*.apiKey',
        ],
        censor: '[redacted]',
      },
      timestamp: pino.stdTimeFunctions.isoTime,
    },
    pino.destination({ fd: 2, sync: false }),
  );
}

export function silentLogger(): Logger {
  return pino({ level: 'silent' });
}
