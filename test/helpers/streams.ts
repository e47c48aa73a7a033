export * from '../../bench/streams.js';
