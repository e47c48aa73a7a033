import js from '@eslint/js';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  { ignores: ['dist/**', 'node_modules/**', '.cache/**', 'bin/**', 'scripts/**', 'eslint.config.js'] },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    files: ['**/*.ts'],
    languageOptions: { parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname } },
    rules: {
      '@typescript-eslint/no-floating-promises': 'error',
      '@typescript-eslint/consistent-type-imports': 'error',
      '@typescript-eslint/no-explicit-any': 'error',
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_' }],
    },
  },
  {
    // Core is pure: no I/O, no clients, no environment (the offline CLI and the services share it).
    files: ['services/*/src/core/**/*.ts'],
    rules: {
      'no-restricted-imports': [
        'error',
        {
          patterns: [
            {
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
            },
            {
              group: ['**/adapters/**', '**/shared/**'],
              message: 'core must not depend on adapters or the runtime',
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
