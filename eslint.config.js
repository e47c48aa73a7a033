import js from '@eslint/js';
import tseslint from 'typescript-eslint';

const SERVICES = ['detector', 'autoseq', 'sequencer', 'flows', 'ingest'];

const PURE = {
  group: [
    'kafkajs',
    'ioredis',
    'prom-client',
    'pino',
    'node:*',
    'fs',
    'net',
    'http',
    'https',
    'child_process',
  ],
  message: 'core must stay free of I/O: put this in an adapter',
};

/** Services import nothing from each other: what two services share lives in shared/. */
const otherServices = (name) => ({
  regex: `(^|/)(${SERVICES.filter((s) => s !== name).join('|')})/(src|test)/`,
  message: 'a service must not import another service: move what they share into shared/',
});

/**
 * flows holds candidates and promoted flows by dedupe_key as the detector sent it: its code never builds or reads
 * one (only its tests build the detector's records). The key's builder lives in shared/core for those tests.
 */
const NO_DEDUPE_KEY = {
  regex: '(^|/)shared/core/dedupe-key(\\.js)?$',
  message: 'flows takes dedupe_key as an opaque id: it must not build or read one',
};
/** Patterns for a service's own code only (src/), beyond the cross-service one. */
const srcOnly = (name) => (name === 'flows' ? [NO_DEDUPE_KEY] : []);

export default tseslint.config(
  { ignores: ['dist/**', 'node_modules/**', '.cache/**', 'bin/**', 'scripts/**', 'eslint.config.js'] },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    files: ['**/*.ts'],
    languageOptions: { parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname } },
    rules: {
      '@typescript-eslint/no-floating-promises': 'error',
      // A promise is always truthy: `if (!guard.ready())` (ready() is async) never skipped, and flows' timers
      // wrote to a Redis being rebuilt. Also refuses a promise passed where a void callback is expected.
      '@typescript-eslint/no-misused-promises': 'error',
      '@typescript-eslint/consistent-type-imports': 'error',
      '@typescript-eslint/no-explicit-any': 'error',
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_' }],
    },
  },
  {
    // The runtime and the contracts never reach up into a service.
    files: ['shared/**/*.ts', 'schemas/**/*.ts'],
    rules: {
      'no-restricted-imports': [
        'error',
        {
          patterns: [{ regex: '(^|/)services/', message: 'shared/ and schemas/ must not import a service' }],
        },
      ],
    },
  },
  ...SERVICES.map((name) => ({
    files: [`services/${name}/**/*.ts`],
    ignores: [`services/${name}/src/core/**`],
    rules: { 'no-restricted-imports': ['error', { patterns: [otherServices(name)] }] },
  })),
  ...SERVICES.filter((name) => srcOnly(name).length > 0).map((name) => ({
    files: [`services/${name}/src/**/*.ts`],
    ignores: [`services/${name}/src/core/**`],
    rules: { 'no-restricted-imports': ['error', { patterns: [otherServices(name), ...srcOnly(name)] }] },
  })),
  ...SERVICES.map((name) => ({
    // Core is pure: no I/O, no clients, no environment (the offline CLI and the services share it).
    // shared/core/ is the one part of shared/ that is pure too, so cores may use it.
    files: [`services/${name}/src/core/**/*.ts`],
    rules: {
      'no-restricted-imports': [
        'error',
        {
          patterns: [
            PURE,
            {
              regex: '(^|/)adapters/|(^|/)shared/(?!core/)',
              message: 'core must not depend on adapters or the runtime (shared/core/ is allowed)',
            },
            otherServices(name),
            ...srcOnly(name),
          ],
        },
      ],
      'no-restricted-globals': [
        'error',
        { name: 'process', message: 'core must not read process state' },
        { name: 'fetch', message: 'core must not do I/O' },
      ],
    },
  })),
  {
    files: ['shared/core/**/*.ts'],
    rules: {
      'no-restricted-imports': [
        'error',
        {
          patterns: [
            PURE,
            {
              regex: '(^|/)services/|^\\.\\./(?!\\.\\./schemas/)',
              message: 'shared/core is pure: it imports only itself and schemas/',
            },
          ],
        },
      ],
      'no-restricted-globals': [
        'error',
        { name: 'process', message: 'core must not read process state' },
        { name: 'fetch', message: 'core must not do I/O' },
      ],
    },
  },
);
