"""Image classifiers for the safety gate, behind one small interface.

`ImageClassifier.score(image) -> (score, label)`: a score in [0, 1] that the page is unwanted, and
the label that gave it. The gate quarantines a page whose score is at or over `--nsfw-threshold`.

- `nudenet` (the default): NudeNet 3.4's detector (`320n.onnx`, shipped inside the `nudenet` wheel,
  so nothing is downloaded at run time), run with onnxruntime on one thread. The score is the
  highest raw detector confidence, over all anchors, of the explicit classes (`UNSAFE`). Raw scores,
  not NudeNet's post-NMS detections, so that thresholds below NudeNet's own 0.2 cut-off mean something.
- `none`: no classifier.
- `package.module:factory`: any callable that returns an object with `name` and `score(image)`;
  it is called once per worker process.
"""
from __future__ import annotations

import importlib
import os
from typing import Protocol

import numpy as np
from PIL import Image


class ImageClassifier(Protocol):
    name: str

    def score(self, image: Image.Image) -> tuple[float, str]: ...


class NudeNetClassifier:
    """NudeNet's ONNX detector, loaded once (per worker process: the gate shares it between threads)."""

    name = "nudenet"
    UNSAFE = ("FEMALE_BREAST_EXPOSED", "FEMALE_GENITALIA_EXPOSED", "MALE_GENITALIA_EXPOSED", "BUTTOCKS_EXPOSED",
              "ANUS_EXPOSED")
    SIDE = 320

    def __init__(self, classes: tuple[str, ...] = UNSAFE, threads: int = 1) -> None:
        import onnxruntime
        from nudenet import nudenet as nn

        self._nn = nn
        labels: list[str] = list(vars(nn)["__labels"])  # the model's class order, as NudeNet defines it
        unknown = set(classes) - set(labels)
        if unknown:
            raise ValueError(f"NudeNet has no class {sorted(unknown)}; it has {labels}")
        self.classes = tuple(classes)
        self._rows = np.array([labels.index(c) for c in classes])
        options = onnxruntime.SessionOptions()
        # One thread: the gate runs beside rendering and the engine; Beam parallelises across pages.
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        path = os.path.join(os.path.dirname(nn.__file__), "320n.onnx")
        self._session = onnxruntime.InferenceSession(path, sess_options=options,
                                                     providers=["CPUExecutionProvider"])
        self._input = self._session.get_inputs()[0].name

    def score(self, image: Image.Image) -> tuple[float, str]:
        # NudeNet's own preprocessing (pad to a square, 320x320, RGB, 0-1) on the BGR array it expects.
        bgr = np.ascontiguousarray(np.asarray(image.convert("RGB"))[:, :, ::-1])
        blob = self._nn._read_image(bgr, self.SIDE)[0]
        out = self._session.run(None, {self._input: blob})[0]  # (1, 4 + classes, anchors)
        per_class = out[0, 4:, :][self._rows].max(axis=1)
        best = int(per_class.argmax())
        return float(per_class[best]), self.classes[best]


def load_classifier(spec: str) -> ImageClassifier | None:
    """`nudenet`, `none`, or `package.module:factory`."""
    spec = (spec or "none").strip()
    if spec == "none":
        return None
    if spec == "nudenet":
        return NudeNetClassifier()
    return load_factory(spec)()


def load_factory(spec: str):
    """The callable named by `package.module:attribute`."""
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise ValueError(f"{spec!r}: expected package.module:factory")
    return getattr(importlib.import_module(module), attr)
