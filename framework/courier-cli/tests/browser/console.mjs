// An operator in a real browser (headless Chromium through Playwright): opens the console,
// finds the dead row and the parked key tests/console_browser.rs caused, retries the one,
// releases the other, republishes a group of dead letters, and watches the page until the
// pipeline has recovered.
//
//   node console.mjs <console url> <token> <dead event id> <parked key> [screenshot.png]
//
// Chromium is Debian's (/usr/bin/chromium, or $CHROMIUM); playwright-core downloads none.
import { chromium } from "playwright-core";

const [url, token, deadEventId, parkedKey, screenshot] = process.argv.slice(2);
if (!parkedKey) {
  console.error("usage: node console.mjs <url> <token> <dead event id> <parked key> [screenshot.png]");
  process.exit(2);
}
const WAIT = 30_000;

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  // Containers and CI runners rarely allow Chromium's own sandbox.
  args: ["--no-sandbox"],
});
try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  page.setDefaultTimeout(WAIT);
  page.on("pageerror", (error) => { throw error; });
  await page.goto(url);

  // Who acts and the token, as an operator enters them once.
  await page.locator("#operator").fill("playwright");
  await page.locator("#token").fill(token);
  await page.getByRole("button", { name: "Save" }).click();

  const deadRow = page.locator(`tr.dead-row[data-event-id="${deadEventId}"]`);
  const parkedRow = page.locator(`tr.parked-key[data-key="${parkedKey}"]`);
  await deadRow.waitFor();
  await parkedRow.waitFor();
  console.log("found the dead row and the parked key");

  if (screenshot) {
    // The dead letters too, for the picture in docs/operations.md.
    await page.locator("tr.dead-letter").nth(1).waitFor();
    await page.locator("#toast").waitFor({ state: "detached" });
    await page.screenshot({ path: screenshot, fullPage: true });
    console.log(`screenshot ${screenshot}`);
  }

  // Nothing overflows sideways on a phone: tables scroll inside their sections.
  await page.setViewportSize({ width: 390, height: 844 });
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth);
  if (overflow > 390) throw new Error(`the page is ${overflow}px wide on a 390px phone`);
  await page.setViewportSize({ width: 1280, height: 900 });

  // Retry the dead row: a reason, then confirm.
  await deadRow.getByRole("button", { name: "Retry" }).click();
  await page.locator("#reason").fill("topic created");
  await page.locator("#confirm-ok").click();
  await deadRow.waitFor({ state: "detached" });
  // Recovered: the key's rows are published, nothing waits in the outbox.
  await page.locator('section[data-schema="courier"] .summary', { hasText: "0 pending" }).waitFor();
  console.log("dead row retried; the outbox drained");

  // Release the parked key, skipping the lost version.
  await parkedRow.getByRole("button", { name: "Release" }).click();
  await page.locator("#skip-to").fill("3");
  await page.locator("#reason").fill("v2 is lost for good");
  await page.locator("#confirm-ok").click();
  await parkedRow.waitFor({ state: "detached" });
  console.log("parked key released");

  // Republish a whole group of dead letters: a bulk action, so its count is confirmed too.
  const group = page.locator(".letter-group", { hasText: "unknown schema version 9" });
  await group.getByRole("button", { name: "Republish 1" }).click();
  await page.locator("#reason").fill("schema v9 deployed");
  await page.locator("#confirm-ok").click();
  if (!(await page.locator("#confirm").evaluate((d) => d.open))) {
    throw new Error("a bulk action went without its count confirmed");
  }
  await page.locator("#count-check").check();
  await page.locator("#confirm-ok").click();
  await group.waitFor({ state: "detached" });
  console.log("dead-letter group republished");

  // Both actions are in the audit log with who and why.
  await page.locator("td", { hasText: "v2 is lost for good" }).waitFor();
  await page.locator("td", { hasText: "topic created" }).waitFor();
  const by = await page.locator("td", { hasText: "playwright (console" }).count();
  if (by < 2) throw new Error(`the audit log names the operator ${by} time(s), not 2`);
  console.log("both actions audited");
} finally {
  await browser.close();
}
