// telegram-test-api as published, on 127.0.0.1:<port>, for Iva's tests (issue 11).
//
//   node tests/emulator/serve.js <port> [--bot-is-a-bot]
//
// The emulator's own Express app answers every request unchanged; this launcher only puts a
// counter in front of it (the emulator keeps no count of what a bot asked) and serves that
// count at GET /__iva/calls as {"<Bot API method>": n, ...}. It prints one line
// "listening <port>" once it accepts connections, and stops on SIGTERM/SIGINT.
//
// --bot-is-a-bot: the one change, for the tests that go past start-up. The emulator's getMe
// answers a user without the required "is_bot" (aiogram cannot read it, so Iva never starts
// serving); with this flag getMe answers that same user with "is_bot": true, and every other
// answer is still the emulator's own.
'use strict';

const http = require('http');
const TelegramServer = require('telegram-test-api');

const port = Number(process.argv[2]);
const botIsABot = process.argv.includes('--bot-is-a-bot');
if (!Number.isInteger(port) || port <= 0) {
  console.error('usage: node serve.js <port> [--bot-is-a-bot]');
  process.exit(2);
}

// storeTimeout: the emulator forgets messages older than this; a test never runs that long.
const server = new TelegramServer({ port, host: '127.0.0.1', storage: 'RAM', storeTimeout: 3600 });
const calls = {};

const front = http.createServer((req, res) => {
  const path = (req.url || '').split('?')[0];
  if (req.method === 'GET' && path === '/__iva/calls') {
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify(calls));
    return;
  }
  const bot = /^\/bot[^/]+\/([^/]+)$/.exec(path);
  if (bot) {
    calls[bot[1]] = (calls[bot[1]] || 0) + 1;
    if (botIsABot && bot[1] === 'getMe') {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({
        ok: true, result: { id: 666, is_bot: true, first_name: 'Test First name', username: 'TestNameBot' },
      }));
      return;
    }
  }
  server.webServer(req, res);
});

front.listen(port, '127.0.0.1', () => {
  console.log(`listening ${port}`);
});

const stop = () => process.exit(0);  // nothing of the emulator's is kept
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
