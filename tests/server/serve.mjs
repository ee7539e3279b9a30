// Starts `pagoda serve` for a client-side test and resolves once it is ready.
// Environment: PAGODA_BINARY (the binary), PAGODA_TEST_DATA (the shared/models folder).
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

// ../shared/models beside the repository, as tests/support/test_data.cpp finds it.
const defaultData = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../shared/models');

export function testData(relative) {
  const dir = process.env.PAGODA_TEST_DATA || defaultData;
  const file = dir ? path.join(dir, relative) : '';
  if (!file || !existsSync(file)) {
    const required = process.env.CI || process.env.PAGODA_REQUIRE_TEST_DATA;
    console.log(`test data missing: ${file || relative} (set PAGODA_TEST_DATA)`);
    // ctest treats exit code 77 as "skipped" (SKIP_RETURN_CODE); CI must fail instead.
    process.exit(required ? 1 : 77);
  }
  return file;
}

export function startServer(args, { timeoutMs = 60000 } = {}) {
  const binary = process.env.PAGODA_BINARY;
  if (!binary) throw new Error('PAGODA_BINARY is not set');
  const child = spawn(binary, ['serve', ...args, '--port', '0'], { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('server not ready:\n' + log)), timeoutMs);
    child.stderr.on('data', (d) => {
      log += d.toString();
      const m = log.match(/ready: (http:\/\/127\.0\.0\.1:\d+)/);
      if (m && timer) {
        clearTimeout(timer);
        resolve({
          url: m[1],
          child,
          log: () => log,
          stop: () => new Promise((r) => { child.once('exit', (code) => r(code)); child.kill('SIGTERM'); }),
        });
      }
    });
    child.once('exit', (code) => reject(new Error(`server exited (${code}):\n` + log)));
  });
}
