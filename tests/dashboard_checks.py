"""Drives the dashboard of a real 3-node cluster in headless Chromium (Debian's, through its
chromedriver and Selenium), the way a person would: it reads the topology, places the model
fixture by clicking a preview, watches its ranks become ready, chats and stops a chat (the test
measures the runners' CPU time when the script prints `RUNNER_CPU`: busy while the long answer
streams, idle once Stop was clicked, so Stop is shown to free the sequence in the runner, not
only to end the page's stream), then has the test kill a node that holds a rank (it prints `KILL <node id>` and waits for `killed` on
stdin), watches the node turn dead and the instance placed again, tries a placement that
cannot be, deletes the instance, and looks at the page on a phone-sized screen. Screenshots go
to --out. The browser's console must stay free of errors, except the one refusal the failed
placement is meant to get.

With --key the node requires that admin API key: the page must first ask for it, say a wrong
one is not accepted, and then work in full with the right one (every check above runs behind
the key; the refusals before it are the only other console errors allowed).

Run by tests/dashboard.rs inside the first node's namespace; each check prints one line.
"""

import argparse
import json
import os
import sys
import time
import urllib.request

os.environ.setdefault("SE_OFFLINE", "true")

from selenium import webdriver  # noqa: E402
from selenium.common.exceptions import StaleElementReferenceException  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import Select  # noqa: E402

ARGS = None
DRIVER = None
STARTED = time.monotonic()


def log(message):
    print(f"[{time.monotonic() - STARTED:6.1f}s] {message}", flush=True)


def fail(message):
    shot("failure")
    log(f"FAILED: {message}")
    try:
        print(DRIVER.find_element(By.TAG_NAME, "main").text[:4000], flush=True)
    except Exception:  # noqa: BLE001
        pass
    sys.exit(1)


def shot(name):
    path = os.path.join(ARGS.out, f"{name}.png")
    DRIVER.save_screenshot(path)
    return path


def wait(what, check, limit):
    """Polls `check` every 100 ms until it returns a truthy value; fails after `limit` s."""
    start = time.monotonic()
    while True:
        try:
            value = check()
        except StaleElementReferenceException:
            value = None
        if value:
            return value, time.monotonic() - start
        if time.monotonic() - start > limit:
            fail(f"{what}: not within {limit} s")
        time.sleep(0.1)


def css(selector):
    return DRIVER.find_elements(By.CSS_SELECTOR, selector)


def api(method, path, body=None):
    """The node's API, as the page sees it (same origin): (status, JSON)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(ARGS.url.rstrip("/") + path, data=data, method=method)
    request.add_header("content-type", "application/json")
    if ARGS.key:
        request.add_header("authorization", f"Bearer {ARGS.key}")
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


TOPOLOGY_SNAPSHOT = """
const g = document.querySelector('#topology-graph');
if (!g) return null;
return {
  nodes: [...g.querySelectorAll("g.node[data-alive='true']")].map((n) => ({
    id: n.getAttribute('data-node-id'), text: n.textContent, me: n.classList.contains('me'),
  })),
  labels: [...g.querySelectorAll('text.edge-label')].map((l) => ({
    // The label as drawn: its text without the tooltip (<title>) inside it.
    text: [...l.childNodes].filter((c) => c.nodeName.toLowerCase() !== 'title')
      .map((c) => c.textContent).join(''),
    ip: l.getAttribute('data-ip'),
    from: l.getAttribute('data-from'), to: l.getAttribute('data-to'),
  })),
};
"""


def topology():
    # Read the graph in one script: the page redraws it as the state changes, so elements
    # held across calls can go stale.
    def ready():
        snap = DRIVER.execute_script(TOPOLOGY_SNAPSHOT)
        if not snap:
            return False
        pairs = {(l["from"], l["to"]) for l in snap["labels"]}
        return len(snap["nodes"]) == 3 and len(pairs) == 6 and snap

    snap, took = wait("3 live nodes and 6 labelled edges", ready, 60)
    ids = {n["id"] for n in snap["nodes"]}
    for label in snap["labels"]:
        text, ip = label["text"].strip(), label["ip"] or ""
        if label["from"] not in ids or label["to"] not in ids:
            fail(f"edge label {text!r} names a node that is not shown")
        if not (text.startswith("Ethernet ") and ip.startswith("10.99.0.") and text.endswith(ip)):
            fail(f"edge label {text!r} (ip {ip!r}) is not an Ethernet address on the bridge")
    for node in snap["nodes"]:
        text = node["text"]
        if "linux" not in text or "GB used" not in text or "mlx_cpu" not in text or "alive" not in text:
            fail(f"node box lacks OS, memory, backends or liveness: {text!r}")
        if "(protocol " not in text or "shoal " not in text:
            fail(f"node box lacks the node's shoal release: {text!r}")
    me = [n["id"] for n in snap["nodes"] if n["me"]]
    if len(me) != 1:
        fail("the page does not mark its own node")
    log(f"topology: 3 nodes alive, 6 edge labels ({sorted(l['text'].strip() for l in snap['labels'])}) after {took:.1f} s")
    shot("01-topology")
    return me[0], ids


def click(element):
    """Clicks as a user would: the element scrolled to the middle of the window first, so the
    sticky header never covers it."""
    DRIVER.execute_script("arguments[0].scrollIntoView({block: 'center'})", element)
    element.click()


def press(element):
    """Clicks a control that moves while an answer streams (the Stop button below a growing
    answer): the click is dispatched on the element itself, as the browser does for a user's
    click on it. A coordinate click can land where the button was a moment before, so the
    page never hears it (seen once under load: Stop "clicked", the answer ran to its end). A
    disabled button ignores this click as it ignores a user's."""
    DRIVER.execute_script("arguments[0].scrollIntoView({block: 'center'})", element)
    if not element.is_enabled():
        fail("the Stop button is disabled while the answer streams")
    DRIVER.execute_script("arguments[0].click()", element)


def form_asks(words):
    """The key form, once it is shown with a message containing `words`."""
    form = DRIVER.find_element(By.ID, "key-form")
    message = DRIVER.find_element(By.ID, "key-message").text
    return form if form.is_displayed() and words in message else None


def give_key(key):
    field = DRIVER.find_element(By.ID, "key-input")
    field.clear()
    field.send_keys(key)
    click(DRIVER.find_element(By.ID, "key-save"))


def key_prompt():
    """A node with an API key: the page asks for it, refuses a wrong one, takes the right
    one. Returns how many refusals the console logged meanwhile (all must be 401s)."""
    _, took = wait("the page asks for the API key", lambda: form_asks("needs an API key"), 20)
    if api_without_key("GET", "/state") != 401:
        fail("the node answers /state without the key")
    shot("00-key-asked")
    log(f"key: the page asked for it after {took:.1f} s")
    give_key("not-the-key-" + ARGS.key)
    _, took = wait("a wrong key is refused", lambda: form_asks("not accepted"), 20)
    log(f"key: a wrong key was refused after {took:.1f} s")
    give_key(ARGS.key)
    wait("the page works with the key", lambda: not form_asks("") and css("#topology-graph g.node"), 30)
    if css("#key-form") and DRIVER.find_element(By.ID, "key-form").is_displayed():
        fail("the key form is still shown with the right key")
    refusals = 0
    for entry in DRIVER.get_log("browser"):
        if entry["level"] != "SEVERE":
            continue
        if entry["source"] == "network" and "401" in entry["message"]:
            refusals += 1
            continue
        fail(f"console error before the key was given: {entry}")
    if refusals == 0:
        fail("no 401 was logged before the key was given")
    log(f"key: the right key was taken ({refusals} refusals logged before it)")
    return refusals


def api_without_key(method, path):
    request = urllib.request.Request(ARGS.url.rstrip("/") + path, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status
    except urllib.error.HTTPError as e:
        return e.code


def preview(sharding, meta, count):
    found = css(f"li.preview[data-sharding='{sharding}'][data-meta='{meta}'][data-count='{count}']")
    return found[0] if found else None


def place():
    field = DRIVER.find_element(By.ID, "place-model")
    field.clear()
    field.send_keys("default", Keys.ENTER)
    status, answer = api("GET", "/instance/previews?model_id=default")
    if status != 200:
        fail(f"GET /instance/previews answered {status}: {answer}")
    expected = len(answer["previews"])
    wait("the previews", lambda: len(css("li.preview")) == expected, 30)
    # Every preview the API calls impossible shows its reason and code on the page.
    impossible = [p for p in answer["previews"] if not p.get("placement")]
    if not impossible:
        fail("the fixture on 3 CPU nodes should have impossible previews (JACCL needs RDMA)")
    reasons = []
    for p in impossible:
        item = preview(p["sharding"], p["instance_meta"], p["node_count"])
        if item is None:
            fail(f"no preview item for {p['sharding']} {p['instance_meta']} {p['node_count']}")
        shown = item.find_element(By.CSS_SELECTOR, ".reason").text
        code = (p.get("error") or {}).get("code", "")
        if not code or code not in shown:
            fail(f"an impossible preview does not say why: {shown!r} (the API says {code!r})")
        reasons.append(code)
    log(f"previews: {expected} as the API lists them; the {len(impossible)} impossible ones say why ({sorted(set(reasons))})")
    # The summary names the model's family and size as the API gives them.
    shape = answer.get("shape") or {}
    summary = DRIVER.find_element(By.ID, "preview-summary").text
    millions = f"{round(shape.get('parameters', 0) / 1e6)} M parameters"
    if not shape.get("family") or shape["family"] not in summary or millions not in summary:
        fail(f"the previews' summary does not give the model's shape {shape}: {summary!r}")
    log(f"previews' summary: {summary!r}")
    two = preview("Pipeline", "MlxRing", 2)
    shot("02-previews")
    start = time.monotonic()
    click(two.find_element(By.CSS_SELECTOR, "button.launch"))
    status, _ = wait(
        "the launch's confirmation",
        lambda: "Created instance" in DRIVER.find_element(By.ID, "place-status").text
        and DRIVER.find_element(By.ID, "place-status").text,
        30,
    )
    log(f"clicked Launch: {status}")
    seen = set()

    def ready():
        cards = css("article.instance")
        if len(cards) != 1:
            return None
        cells = cards[0].find_elements(By.CSS_SELECTOR, "td.runner")
        states = [c.get_attribute("data-state") for c in cells]
        seen.update(states)
        return len(states) == 2 and all(s in ("ready", "running") for s in states) and cards[0]

    card, _ = wait("both ranks ready", ready, 240)
    rows = card.find_elements(By.CSS_SELECTOR, "tr[data-rank]")
    nodes = [r.get_attribute("data-node") for r in rows]
    layers = [r.find_elements(By.TAG_NAME, "td")[2].text for r in rows]
    log(
        f"instance ready {time.monotonic() - start:.1f} s after the click; ranks on "
        f"{[n[:8] for n in nodes]}, layers {layers}; runner states seen: {sorted(seen)}"
    )
    if card.get_attribute("data-status") != "ready":
        fail(f"the instance's badge is {card.get_attribute('data-status')}")
    shot("03-instance-ready")
    return card.get_attribute("data-instance-id"), nodes


def chat():
    def model_listed():
        options = [o.get_attribute("value") for o in css("#chat-model option")]
        return "default" in options

    wait("the running model in the chat picker", model_listed, 30)
    Select(DRIVER.find_element(By.ID, "chat-model")).select_by_value("default")
    # A text-only model offers no image to attach (dashboard_image_checks.py sees it offered).
    if DRIVER.find_element(By.ID, "chat-attach").is_displayed():
        fail("the chat offers to attach an image to a text-only model")
    box = DRIVER.find_element(By.ID, "chat-input")
    # The answer's lengths as the page changes them (a MutationObserver in the page), not
    # only as the polls below happen to see them: on a quiet machine the short answer streams
    # in ~150 ms, quicker than a few WebDriver round trips (a poll saw only [0, 31]).
    DRIVER.execute_script("""
        window.shoalLengths = [];
        new MutationObserver(() => {
            const answers = document.querySelectorAll('.message.assistant .content');
            if (answers.length) {
                window.shoalLengths.push(answers[answers.length - 1].textContent.length);
            }
        }).observe(document.body, {subtree: true, childList: true, characterData: true});
    """)
    box.send_keys("What is the capital of France?", Keys.ENTER)
    lengths = set()

    def finished():
        answers = css(".message.assistant")
        if not answers:
            return None
        lengths.add(len(answers[-1].find_element(By.CSS_SELECTOR, ".content").text))
        streaming = "streaming" in answers[-1].get_attribute("class")
        return not streaming and answers[-1]

    answer, took = wait("the answer", finished, 120)
    lengths.update(DRIVER.execute_script("return window.shoalLengths || [];"))
    text = answer.find_element(By.CSS_SELECTOR, ".content").text
    stats = DRIVER.find_element(By.ID, "chat-stats")
    if "Paris" not in text:
        fail(f"the answer does not say Paris: {text!r}")
    if len(lengths) < 3:
        fail(f"the answer did not stream (lengths seen: {sorted(lengths)})")
    ttft = stats.get_attribute("data-ttft-ms")
    rate = stats.get_attribute("data-tokens-per-second")
    if not ttft or not rate or "tokens/s" not in stats.text:
        fail(f"no time to first token or tokens/s: {stats.text!r}")
    log(f"chat: {text!r} streamed in {took:.1f} s ({len(lengths)} lengths seen); {stats.text}")
    shot("04-chat")
    # A long answer, stopped from the page. A fresh conversation: after the first question
    # the model answers this one with "Paris" again, 8 tokens that end before Stop matters.
    click(DRIVER.find_element(By.ID, "chat-clear"))
    wait("the cleared chat", lambda: not css(".message"), 10)
    # SmolLM2 tells this story for over 1,500 tokens greedily (`shoal generate --chat`): over
    # 20 s at any speed this cluster decodes. "Count from 1 to 500" ended after 122 tokens,
    # under 3 s once decoding got faster, before Stop could be pressed.
    box.send_keys("Write a long story about a dragon named Bob who lives in a castle.", Keys.ENTER)

    def some_text():
        answers = css(".message.assistant")
        return len(answers) == 1 and len(answers[-1].find_element(By.CSS_SELECTOR, ".content").text) > 10

    wait("the long answer's first tokens", some_text, 60)
    busy = runner_cpu()
    if sum(busy) < BUSY_CPU:
        fail(f"the runners used only {busy} CPU s in 2 s while the answer streamed")
    press(DRIVER.find_element(By.ID, "chat-stop"))
    stopped = time.monotonic()
    wait("the stopped answer", lambda: "finished: stopped" in stats.text, 15)
    ended = time.monotonic() - stopped
    text = css(".message.assistant")[-1].find_element(By.CSS_SELECTOR, ".content").text
    if len(text.split()) > 1000:
        fail(f"the answer ran to its end ({len(text.split())} words)")
    # Give the stop a moment to travel (node, forward, every rank), then watch the runners.
    time.sleep(1)
    idle = runner_cpu()
    if max(idle, default=0.0) >= IDLE_CPU:
        fail(f"a runner still computes after Stop: {idle} CPU s in 2 s (busy before: {busy})")
    log(
        f"stop: the stream ended {ended:.1f} s after Stop, at {text[-30:]!r}; "
        f"runner CPU per 2 s {busy} while streaming, {idle} after Stop"
    )


# CPU seconds over 2 s: the instance's runners together use more while they generate (the
# pipeline's ranks measured 0.3-1.9 s each), every runner less once idle (measured 0.00).
BUSY_CPU = 0.2
IDLE_CPU = 0.1


def runner_cpu():
    """The CPU seconds each runner process of the cluster used over 2 s, measured by the test
    (it reads /proc for every node's namespace) when asked with `RUNNER_CPU` on stdout."""
    print("RUNNER_CPU", flush=True)
    answer = sys.stdin.readline().split()
    if not answer or answer[0] != "cpu":
        fail(f"the test did not measure the runners: {answer}")
    return [round(float(x), 2) for x in answer[1:]]


def kill_and_replace(me, instance, rank_nodes):
    victim = next(n for n in rank_nodes if n != me)
    print(f"KILL {victim}", flush=True)
    if sys.stdin.readline().strip() != "killed":
        fail("the test did not kill the node")
    killed = time.monotonic()
    _, took = wait(
        "the killed node shown dead",
        lambda: css(f"#topology-graph g.node[data-node-id='{victim}'][data-alive='false']"),
        60,
    )
    log(f"node {victim[:8]} shown dead {took:.1f} s after the kill")

    def replaced():
        card = css(f"article.instance[data-instance-id='{instance}']")
        if not card or card[0].get_attribute("data-epoch") == "0":
            return None
        rows = card[0].find_elements(By.CSS_SELECTOR, "tr[data-rank]")
        nodes = [r.get_attribute("data-node") for r in rows]
        states = [r.find_element(By.CSS_SELECTOR, "td.runner").get_attribute("data-state") for r in rows]
        ok = (
            card[0].get_attribute("data-status") == "ready"
            and victim not in nodes
            and all(s in ("ready", "running") for s in states)
        )
        return ok and (card[0], nodes)

    (card, nodes), _ = wait("the instance placed again and ready", replaced, 180)
    if "placed again without" not in card.text:
        fail(f"the card does not say which node was left out: {card.text!r}")
    log(
        f"instance placed again on {[n[:8] for n in nodes]} (epoch "
        f"{card.get_attribute('data-epoch')}) and ready {time.monotonic() - killed:.1f} s after the kill"
    )
    shot("05-dead-and-replaced")


def failed_placement():
    status, refusal = api("POST", "/place_instance", {"model_id": "default", "min_nodes": 5})
    if status == 200:
        fail(f"a 5-node placement on 2 live nodes succeeded: {refusal}")
    reason = refusal["error"]["message"]
    count = DRIVER.find_element(By.ID, "place-min-nodes")
    count.clear()
    count.send_keys("5")
    click(DRIVER.find_element(By.ID, "place-submit"))
    shown, _ = wait(
        "the refusal's reason",
        lambda: DRIVER.find_element(By.ID, "place-error").is_displayed()
        and DRIVER.find_element(By.ID, "place-error").text,
        15,
    )
    if reason not in shown:
        fail(f"the page shows {shown!r}, not the node's reason {reason!r}")
    log(f"failed placement shown where it was asked: {shown!r}")
    shot("06-failed-placement")


def delete(instance):
    card = css(f"article.instance[data-instance-id='{instance}']")[0]
    click(card.find_element(By.CSS_SELECTOR, "button.danger"))
    _, took = wait("the deleted instance gone", lambda: not css("article.instance"), 30)
    log(f"deleted from the page; its card left {took:.1f} s after the click")


def phone():
    DRIVER.set_window_size(390, 844)
    time.sleep(0.5)
    listed = css("#node-list li")
    drawn = css("#topology-graph g.node")
    if len(listed) < 2 or len(listed) != len(drawn) or not listed[0].is_displayed():
        fail("a phone-sized screen does not list the nodes")
    if DRIVER.find_element(By.ID, "topology-graph").is_displayed():
        fail("a phone-sized screen still shows the graph")
    overflow = DRIVER.execute_script(
        "return document.documentElement.scrollWidth - document.documentElement.clientWidth"
    )
    if overflow > 0:
        fail(f"the page is {overflow} px wider than a phone's screen")
    log("phone: the nodes listed, nothing wider than the screen")
    shot("07-phone")


def console_errors():
    allowed = []
    problems = []
    for entry in DRIVER.get_log("browser"):
        if entry["level"] != "SEVERE":
            continue
        # The failed placement's refusal is logged by Chromium as a failed resource.
        if entry["source"] == "network" and "/place_instance" in entry["message"]:
            allowed.append(entry["message"])
            continue
        problems.append(entry)
    if problems:
        fail(f"console errors: {problems}")
    log(f"console: no errors (besides the refused placement: {len(allowed)})")


def main():
    global ARGS, DRIVER
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--key", default="", help="the node's admin API key, if it has one")
    ARGS = parser.parse_args()
    DRIVER = browser(ARGS.out)
    try:
        DRIVER.get(ARGS.url)
        if ARGS.key:
            key_prompt()
        me, _ = topology()
        instance, rank_nodes = place()
        chat()
        kill_and_replace(me, instance, rank_nodes)
        failed_placement()
        delete(instance)
        phone()
        console_errors()
    finally:
        DRIVER.quit()
    log("all dashboard checks passed")


def browser(out):
    """Headless Chromium through its chromedriver, its profile and screenshots under `out`
    (also used by dashboard_image_checks.py)."""
    os.makedirs(out, exist_ok=True)
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for arg in [
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1280,1000",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={os.path.join(out, 'profile')}",
    ]:
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)


if __name__ == "__main__":
    main()
