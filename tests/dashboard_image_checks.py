"""The dashboard's chat attaches an image for a model that sees images, in headless Chromium
(Debian's, through its chromedriver and Selenium), the way a person would: it picks the vision
model (listed as seeing images), chooses the fixture image in the chat's file input, sees its
preview, sends the fixture's question and reads the streamed answer, which must begin with
mlx-vlm's greedy answer for that image (the page sets no length; Stop ends it); then it pastes
the image into the message box instead and gets the same answer. The page sends the image as
an OpenAI `image_url` part holding a data URL. The browser's console must stay free of errors.

Usage: python dashboard_image_checks.py --url URL --out DIR --reference REFERENCE_JSON
       --images IMAGES_DIR --model MODEL

Run by tests/dashboard.rs inside the node's namespace; each check prints one line. Reuses the
helpers of dashboard_checks.py (its browser, waits and screenshots).
"""

import argparse
import base64
import json
import sys
from pathlib import Path

import dashboard_checks as d
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import Select


def answer_of(want, limit):
    """Waits for the last answer to begin with `want` (or to end without it), stops it, and
    returns its text."""

    def begun():
        answers = d.css(".message.assistant")
        if not answers:
            return None
        text = answers[-1].find_element(By.CSS_SELECTOR, ".content").text
        streaming = "streaming" in answers[-1].get_attribute("class")
        return (text.startswith(want.strip()) or not streaming) and text

    text, took = d.wait("the answer to the image", begun, limit)
    stop = d.DRIVER.find_element(By.ID, "chat-stop")
    if stop.is_enabled():
        d.press(stop)
    d.wait("the answer to end", lambda: not d.css(".message.streaming"), 60)
    return text, took


def choose_model(model):
    def listed():
        options = {o.get_attribute("value"): o.text for o in d.css("#chat-model option")}
        return model in options and options

    options, _ = d.wait("the vision model in the chat picker", listed, 60)
    if "sees images" not in options[model]:
        d.fail(f"the picker does not say the model sees images: {options[model]!r}")
    Select(d.DRIVER.find_element(By.ID, "chat-model")).select_by_value(model)
    if not d.DRIVER.find_element(By.ID, "chat-attach").is_displayed():
        d.fail("the chat offers no image attachment for a vision model")
    d.log(f"picker: {options[model]!r}, the image attachment shown")


def sent_images():
    """The images of the conversation's user turns, as the page holds and sent them."""
    return d.DRIVER.execute_script(
        "return [...document.querySelectorAll('.message.user img.thumb')].map(i => i.src);")


def main():
    parser = argparse.ArgumentParser()
    for name in ["--url", "--out", "--reference", "--images", "--model"]:
        parser.add_argument(name, required=True)
    parser.add_argument("--key", default="")
    d.ARGS = args = parser.parse_args()
    reference = json.loads(Path(args.reference).read_text())
    want = reference["answers"]["square.png"]["text"]
    image = Path(args.images) / "square.png"
    data_url = "data:image/png;base64," + base64.b64encode(image.read_bytes()).decode()
    d.DRIVER = d.browser(args.out)
    try:
        d.DRIVER.get(args.url)
        choose_model(args.model)
        # 1. The file input.
        d.DRIVER.find_element(By.ID, "chat-image").send_keys(str(image))
        d.wait("the preview", lambda: d.DRIVER.find_element(By.ID, "chat-image-preview")
               .is_displayed(), 10)
        box = d.DRIVER.find_element(By.ID, "chat-input")
        box.send_keys(reference["question"], Keys.ENTER)
        text, took = answer_of(want, 120)
        thumbs = sent_images()
        if thumbs != [data_url]:
            d.fail(f"the page did not send the file as its data URL: {[t[:60] for t in thumbs]}")
        if not text.startswith(want.strip()):
            d.fail(f"the answer {text[:120]!r} does not begin with mlx-vlm's {want!r}")
        if d.DRIVER.find_element(By.ID, "chat-image-preview").is_displayed():
            d.fail("the attachment is still shown after sending")
        d.log(f"file input: {text[:80]!r} begins with mlx-vlm's answer {want!r} ({took:.1f} s)")
        d.shot("image-01-file")
        # 2. Pasted into a fresh conversation: a synthetic paste event carrying the file.
        d.click(d.DRIVER.find_element(By.ID, "chat-clear"))
        d.wait("the cleared chat", lambda: not d.css(".message"), 10)
        d.DRIVER.execute_script("""
            const [url, box] = arguments;
            const bytes = Uint8Array.from(atob(url.split(',')[1]), (c) => c.charCodeAt(0));
            const data = new DataTransfer();
            data.items.add(new File([bytes], 'pasted.png', { type: 'image/png' }));
            box.dispatchEvent(new ClipboardEvent('paste', { clipboardData: data, bubbles: true,
                                                           cancelable: true }));
        """, data_url, box)
        d.wait("the pasted image's preview", lambda: d.DRIVER.find_element(
            By.ID, "chat-image-preview").is_displayed(), 10)
        box.send_keys(reference["question"], Keys.ENTER)
        pasted, took = answer_of(want, 120)
        if not pasted.startswith(want.strip()) or sent_images() != [data_url]:
            d.fail(f"the pasted image's answer {pasted[:120]!r} does not begin with {want!r}")
        d.log(f"pasted: {pasted[:80]!r} begins with mlx-vlm's answer ({took:.1f} s)")
        d.shot("image-02-pasted")
        d.console_errors()
    finally:
        d.DRIVER.quit()
    d.log("all dashboard image checks passed")


if __name__ == "__main__":
    sys.exit(main())
