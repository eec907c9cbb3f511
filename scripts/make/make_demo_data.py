"""Build a small conversation dataset from the photos bundled with scikit-image.

Every image comes from a ``skimage.data`` loader that reads a file shipped in the
scikit-image wheel, so no network access is needed. Each image is converted to
RGB uint8, shrunk so that its longer side is at most ``--max-side`` pixels (the
aspect ratio is kept, so sizes differ), and saved as ``OUT_DIR/images/<name>.png``.
``OUT_DIR/train.jsonl`` holds conversations in the ``messages``/``images`` form of
TRL and LLaMA-Factory, one JSON object per line. Their answers take one short fixed
form with a one-word label per photo (``In one word: food.``), a task the demo's
tiny model learns in its 45 steps, so that its reply before and after training
shows what fine-tuning changed (``scripts/report/demo_reply.py``):

- one image, one row per hand-written caption (2-3 per photo), the content a string
  with an ``<image>`` placeholder or a list of parts (alternating), some with a
  system message, answered ``In one word: <word>.``;
- two- and three-image rows, answered ``In order: <word>, <word>.``;
- multi-turn rows: the one-word answer, then ``Again: <word>.`` when asked again;
- a few text-only rows::

    {"messages": [{"role": "user", "content": "<image>Describe the image."},
                  {"role": "assistant", "content": "In one word: food."}], "images": ["images/coffee.png"]}

Image paths are relative to OUT_DIR. ``OUT_DIR/held_out/motorcycle_right.png`` is
an image no row uses. ``OUT_DIR/captions.jsonl`` keeps the captions as the older
``{"image", "prompt", "caption"}`` rows, and ``OUT_DIR/text.jsonl`` the captions as
plain text, a few per row (``{"text": "..."}``), for the decoder-only LM recipes.
The output is deterministic and running the script again overwrites it.

Usage::

    python scripts/make/make_demo_data.py OUT_DIR [--max-side 112]
"""

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import skimage.data
from PIL import Image

PROMPTS = ["Describe the image.", "What is shown here?", "Give a short caption."]

# (skimage.data loader name, the one-word answer the conversations teach, captions); only loaders backed by files
# in the wheel. Each word is one token of the demo's cut vocabulary.
PHOTOS = [
    ("astronaut", "person", ["An astronaut in an orange flight suit, smiling.",
                             "A woman astronaut beside an American flag and a helmet.",
                             "Portrait of an astronaut with a space shuttle model."]),
    ("brick", "ground", ["A grey brick wall seen at an angle.",
                         "Rows of rectangular bricks in a wall."]),
    ("camera", "person", ["A man looking through a camera on a tripod.",
                          "A black and white photo of a photographer in a field.",
                          "A cameraman in a dark coat on a grassy field."]),
    ("cell", "cell", ["A single round cell in a grey microscope image.",
                      "A bright cell on a dark grey background."]),
    ("chelsea", "face", ["A close-up of a tabby cat's face.",
                         "An orange tabby cat with green eyes.",
                         "A cat's face with long white whiskers."]),
    ("checkerboard", "art", ["A black and white checkerboard pattern.",
                             "A grid of alternating black and white squares."]),
    ("clock", "object", ["A motion-blurred clock on a grey background.",
                         "A blurry round clock in a greyscale photo."]),
    ("coffee", "food", ["A cup of coffee on a red saucer.",
                        "An espresso cup with a spoon on a wooden table.",
                        "A red cup and saucer holding coffee."]),
    ("coins", "object", ["Rows of old coins on a dark background.",
                         "A greyscale photo of many ancient coins."]),
    ("colorwheel", "color", ["A round color wheel on a black background.",
                             "A circle blending all hues around a white center."]),
    ("grass", "ground", ["A greyscale close-up texture of grass.",
                         "Blades of grass seen from above."]),
    ("gravel", "ground", ["A greyscale texture of small gravel stones.",
                          "Many small pebbles covering the ground."]),
    ("horse", "art", ["A black silhouette of a horse on white.",
                      "The outline of a standing horse, in black."]),
    ("hubble_deep_field", "space", ["Many distant galaxies against the black of space.",
                                    "A deep space telescope image full of galaxies.",
                                    "Colorful specks of galaxies on a dark sky."]),
    ("immunohistochemistry", "cell", ["A stained tissue sample under a microscope.",
                                      "Brown stained cells and blue nuclei in tissue."]),
    ("logo", "art", ["The scikit-image logo with a snake.",
                     "A green and orange circle with a snake drawing."]),
    ("microaneurysms", "cell", ["A grey close-up of blood vessels in a retina.",
                                "Retinal blood vessels with a few small dark spots."]),
    ("moon", "space", ["A greyscale image of the moon's surface.",
                       "Craters and rocks on the lunar surface."]),
    ("page", "text", ["A scanned book page about region-based segmentation.",
                      "A page of printed text with a heading."]),
    ("retina", "cell", ["A color photo of the back of a human eye.",
                        "A red retina with branching blood vessels."]),
    ("rocket", "space", ["A rocket on its launch pad in the evening.",
                         "A rocket between launch towers under a dark blue sky.",
                         "A tall rocket lit up by lights on the pad."]),
    ("shepp_logan_phantom", "head", ["The Shepp-Logan phantom, a test image of a head.",
                                     "Grey ellipses inside a white oval on black."]),
    ("stereo_motorcycle", "object", ["A red motorcycle parked in a garage.",
                                     "A red motorbike in front of shelves with boxes."]),
    ("text", "text", ["Handwritten math formulas seen at an angle.",
                      "A greyscale photo of handwritten equations."]),
]


def to_rgb_uint8(a):
    """Return ``a`` as an (H, W, 3) uint8 array."""
    a = np.asarray(a)
    if a.dtype == bool:
        a = a.astype(np.uint8) * 255
    elif a.dtype.kind == "f":
        a = np.round(np.clip(a, 0.0, 1.0) * 255).astype(np.uint8)
    elif a.dtype != np.uint8:
        a = np.round(a.astype(np.float64) * 255 / np.iinfo(a.dtype).max).astype(np.uint8)
    if a.ndim == 2:
        a = np.stack([a, a, a], axis=-1)
    return np.ascontiguousarray(a[..., :3])


TEXT_ONLY = [("What does a pipeline bubble mean?", "Time a pipeline rank spends waiting instead of computing."),
             ("Why split a model into stages?", "So that each device holds and computes only part of the model."),
             ("What is a micro-batch?", "A slice of the batch that moves through the pipeline on its own.")]
SYSTEM = "You name what a photo shows in one word."
ANSWER = "In one word: {}."  # every one-image answer: the form the demo's 45 steps teach (scripts/report/demo_reply.py)


def user(text: str, images: int, parts: bool) -> dict:
    """A user turn with ``images`` images before ``text``: a string with ``<image>`` placeholders, or parts."""
    if parts:
        return {"role": "user", "content": [{"type": "image"}] * images + [{"type": "text", "text": text}]}
    return {"role": "user", "content": "<image>" * images + text}


def make_conversations(rows: list[dict], words: dict[str, str]) -> list[dict]:
    """Conversation rows from the caption rows (deterministic), each answer in one short fixed form built from
    ``words`` (image path -> its one-word answer): every caption row once as a one-image turn answered
    ``In one word: <word>.``, then two- and three-image rows (``In order: <word>, <word>.``), multi-turn rows (a
    second answer ``Again: <word>.``) and text-only rows."""
    by_image: dict[str, list[str]] = {}
    for row in rows:
        by_image.setdefault(row["image"], []).append(row["caption"])
    images = sorted(by_image)
    out = []
    for i, row in enumerate(rows):
        messages = [user(row["prompt"], 1, parts=i % 2 == 1),
                    {"role": "assistant", "content": ANSWER.format(words[row["image"]])}]
        if i % 5 == 0:
            messages.insert(0, {"role": "system", "content": SYSTEM})
        out.append({"messages": messages, "images": [row["image"]]})
    for i in range(len(images)):
        n = 2 + i % 2
        chosen = [images[(i + 5 * j) % len(images)] for j in range(n)]
        answer = "In order: " + ", ".join(words[p] for p in chosen) + "."
        out.append({"messages": [user(f"Describe these {n} images in order.", n, parts=i % 2 == 0),
                                 {"role": "assistant", "content": answer}], "images": chosen})
    for i, path in enumerate(images[::3]):
        out.append({"messages": [user("What is in this photo?", 1, parts=i % 2 == 0),
                                 {"role": "assistant", "content": ANSWER.format(words[path])},
                                 {"role": "user", "content": "Say it again."},
                                 {"role": "assistant", "content": f"Again: {words[path]}."}], "images": [path]})
    for question, answer in TEXT_ONLY:
        out.append({"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]})
    return out


def held_out(out_dir: Path, max_side: int) -> None:
    """Write ``OUT_DIR/held_out/motorcycle_right.png``, an image no row uses: the right-hand view of the stereo
    pair whose left view the rows use (``scripts/report/demo_reply.py`` asks the model about it)."""
    (out_dir / "held_out").mkdir(parents=True, exist_ok=True)
    image = Image.fromarray(to_rgb_uint8(skimage.data.stereo_motorcycle()[1]))
    image.thumbnail((max_side, max_side), Image.LANCZOS)
    image.save(out_dir / "held_out" / "motorcycle_right.png")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path, help="directory to write train.jsonl and images/ into")
    parser.add_argument("--max-side", type=int, default=112, help="longest image side in pixels")
    args = parser.parse_args(argv)

    start = time.perf_counter()
    image_dir = args.out_dir / "images"
    image_dir.mkdir(parents=True, exist_ok=True)
    rows, words, n_images, k = [], {}, 0, 0
    for name, word, captions in PHOTOS:
        try:
            array = getattr(skimage.data, name)()
        except Exception as exc:  # e.g. a loader that would need to download
            print(f"skipping {name}: {type(exc).__name__}: {exc}", file=sys.stderr)
            continue
        if isinstance(array, tuple):  # stereo_motorcycle returns (left, right, disparity)
            array = array[0]
        image = Image.fromarray(to_rgb_uint8(array))
        image.thumbnail((args.max_side, args.max_side), Image.LANCZOS)
        rel_path = f"images/{name}.png"
        image.save(args.out_dir / rel_path)
        words[rel_path] = word
        n_images += 1
        for caption in captions:
            rows.append({"image": rel_path, "prompt": PROMPTS[k % len(PROMPTS)], "caption": caption})
            k += 1

    held_out(args.out_dir, args.max_side)
    conversations = make_conversations(rows, words)
    for name, lines in (("train.jsonl", conversations), ("captions.jsonl", rows)):
        with open(args.out_dir / name, "w", encoding="utf-8") as f:
            for row in lines:
                f.write(json.dumps(row) + "\n")
    captions = [row["caption"] for row in rows]
    with open(args.out_dir / "text.jsonl", "w", encoding="utf-8") as f:
        for i in range(len(captions)):
            f.write(json.dumps({"text": " ".join(captions[i:i + 1 + i % 3])}) + "\n")
    elapsed = time.perf_counter() - start
    counts = [len(row.get("images", [])) for row in conversations]
    print(f"wrote {len(conversations)} conversations ({counts.count(2)} with 2 images, {counts.count(3)} with 3, "
          f"{sum(len(r['messages']) > 3 for r in conversations)} multi-turn, {counts.count(0)} text-only), "
          f"{n_images} images, {len(rows)} caption rows and {len(captions)} text rows to {args.out_dir} "
          f"in {elapsed:.1f}s")


if __name__ == "__main__":
    main()
