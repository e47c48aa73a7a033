export async function replayCommand(_argv: string[]): Promise<number> {
  process.stderr.write('paver flows replay: not built yet\n');
  return 2;
}
