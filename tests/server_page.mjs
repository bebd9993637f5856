// The page of `kvpred serve` (GET /) in headless Chromium (Debian's /usr/bin/chromium, driven by
// playwright-core; run by tests/test_server.py): type a prompt, press Send, wait for the
// streamed answer, and check the answer and the KV panel in the DOM. Argument 3 is the API key
// ('' for none); argument 4, if given, where to save a screenshot (docs/server-page.png). Prints one JSON line; exits non-zero on a failed check.
import { chromium } from 'playwright-core';

const [port, prompt, key, shot] = process.argv.slice(2);
const fail = (msg) => { console.error('FAIL:', msg); process.exit(1); };
const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking',
           '--no-first-run', '--disable-component-update', '--disable-sync'] });
try {
    const page = await browser.newPage({ viewport: { width: 1000, height: 560 } });
    await page.goto(`http://127.0.0.1:${port}/`);
    if (key) {
        await page.fill('#key', key);
        await page.evaluate(() => loadModels()); /* the list needs the key */
    }
    await page.waitForFunction(() => document.querySelectorAll('#policy option').length > 2);
    await page.selectOption('#policy', 'quest');
    await page.fill('#budget', '1/2');
    await page.fill('#maxtok', '40');
    await page.fill('#prompt', prompt);
    await page.click('#send');
    await page.waitForFunction(() => document.getElementById('status').textContent === 'done',
                               null, { timeout: 30000 });
    const got = await page.evaluate(() => ({
        answer: document.querySelector('.msg.assistant')?.textContent ?? '',
        cached: document.getElementById('p-cached').textContent,
        hot: document.getElementById('p-hot').textContent,
        cold: document.getElementById('p-cold').textContent,
        share: document.getElementById('p-share').textContent,
        ttft: document.getElementById('p-ttft').textContent,
    }));
    if (!got.answer) fail('no streamed answer');
    if (!(parseInt(got.cached) > 0)) fail(`tokens cached: ${got.cached}`);
    if (!/B$/.test(got.hot)) fail(`bytes hot: ${got.hot}`);
    if (!/%$/.test(got.share)) fail(`share: ${got.share}`);
    // a second turn: the conversation's first prompt is reused from the cache
    await page.fill('#prompt', 'And then?');
    await page.click('#send');
    await page.waitForFunction(() => document.querySelectorAll('.msg.assistant').length === 2 &&
                               document.getElementById('status').textContent === 'done',
                               null, { timeout: 30000 });
    got.hits = await page.evaluate(() => document.getElementById('p-hits').textContent);
    got.reused = await page.evaluate(() => document.getElementById('p-reused').textContent);
    if (!(parseInt(got.hits) >= 1)) fail(`prefix-cache hits: ${got.hits}`);
    if (shot) await page.screenshot({ path: shot });
    console.log(JSON.stringify(got));
} finally {
    await browser.close();
}
