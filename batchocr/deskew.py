"""Page geometry from detected text boxes: which way up the page is, the skew angle,
the text height, and the one affine warp (rotation and scale) that straightens a
page and brings its text to the recogniser's preferred height.

Estimating from the detector's boxes costs nothing extra (the detector has run
anyway); a projection profile would cost a pass over the pixels per angle tried.
"""

from __future__ import annotations

import math
from typing import Sequence

import cv2
import numpy as np

# Boxes at least this many times wider than high carry a usable direction.
MIN_ASPECT = 3.0
# Fewer usable boxes than this: the angle is unknown, taken as 0.
MIN_BOXES = 3
# Pages skewed by less than this (degrees) are not warped: their boxes are turned instead.
STRAIGHTEN_ABOVE = 0.5
# Box heights (px, in the image the detector saw) outside this range are rescaled to
# TEXT_HEIGHT: tiny text is lost by the detector, huge text costs pixels for nothing.
TEXT_HEIGHT_RANGE = (20.0, 80.0)
TEXT_HEIGHT = 36.0
# The rescaled image's longest side stays at most this (detector time grows with pixels);
# its pixel count is bounded by the engine's memory budget too (plan's max_pixels).
MAX_SIDE = 4000
# rapidocr cuts a box at least this many times taller than wide out turned a quarter
# counter-clockwise (rapidocr.utils.process_img.get_rotate_crop_image).
CROP_TURNED = 1.5
# Which way up a page is, is voted on by its longest lines' crops: the longest read most surely.
ORIENT_LINES = 32
# Its crops are taken as upside down only where the length read upside down exceeds the length
# read upright by this share of the two: most pages are upright, and a near tie (a few lines of
# large handwriting the classifier is unsure of) leaves the page as it is.
FLIP_MARGIN = 0.2


def quarter_turns(quads, upside_down: Sequence[bool | None]) -> int:
    """Quarter turns counter-clockwise (np.rot90's k) that bring a page upright, from the
    boxes detected on it and, for each box's crop as rapidocr cuts it (a tall box turned
    a quarter counter-clockwise), whether a line classifier reads it upside down (True),
    upright (False) or is unsure (None).

    The page lies sideways when more of its boxes' length is in tall boxes than in wide
    ones; its crops read upside down when, of the classified length (the crops' widths),
    the length read upside down exceeds the length read upright by FLIP_MARGIN of the two.
    A vote over the page rather than each line taken alone: the classifier turns some
    upright lines of an upright page."""
    q = np.asarray(quads, dtype=np.float64).reshape(-1, 4, 2)
    if len(q) == 0:
        return 0
    w = np.hypot(*(q[:, 1] - q[:, 0]).T)
    h = np.hypot(*(q[:, 3] - q[:, 0]).T)
    sideways = h[h >= CROP_TURNED * w].sum() > w[w >= CROP_TURNED * h].sum()
    length = np.where(h >= CROP_TURNED * w, h, w)  # the crop's width
    down = sum(n for n, v in zip(length, upside_down) if v is True)
    up = sum(n for n, v in zip(length, upside_down) if v is False)
    flipped = down - up > FLIP_MARGIN * (down + up)
    if sideways:
        return 3 if flipped else 1
    return 2 if flipped else 0


def plan(quads, shape: tuple[int, ...], *, deskew: bool = True, rescale: bool = True,
         most: float = 1.0, max_pixels: float | None = None) -> tuple[float, float, float]:
    """(skew angle, rotation to apply, scale to apply) for a page whose detector saw
    an image of `shape` and found `quads`: rotate if the skew is above
    STRAIGHTEN_ABOVE, scale if the text height is outside TEXT_HEIGHT_RANGE.

    Enlarging goes no further than `most` (the original pixels: rapidocr shrank the
    page to 2000 px, losing small text on a large page). Enlarging beyond them adds
    no detail: rapidocr's detector already enlarges small images itself (shorter
    side to 736 px), and on 50-100 dpi pages doing it again gained nothing.

    The warped image has at most `max_pixels` pixels (its canvas, rotation
    included): the scale is lowered to fit, below 1 if need be. An engine derives
    it from its memory budget (batchocr.engines.rapidocr: memory_mb)."""
    angle = skew_angle(quads) if deskew else 0.0
    rotate = angle if abs(angle) >= STRAIGHTEN_ABOVE else 0.0
    scale = 1.0
    height = text_height(quads) if rescale else 0.0
    if height and not TEXT_HEIGHT_RANGE[0] <= height <= TEXT_HEIGHT_RANGE[1]:
        scale = min(TEXT_HEIGHT / height, MAX_SIDE / max(shape[:2]), max(most, 1.0))
        if abs(scale - 1) < 0.1:
            scale = 1.0
    return angle, rotate, bound(scale, rotate, shape, max_pixels)


def bound(scale: float, rotate: float, shape: tuple[int, ...], max_pixels: float | None) -> float:
    """`scale` lowered so that the warp of an image of `shape`, turned by `rotate`,
    has at most `max_pixels` pixels (plan's bound)."""
    if max_pixels and (rotate or scale != 1.0):
        scale = min(scale, 0.999 * math.sqrt(max_pixels / canvas_pixels(shape, rotate)))  # 0.999: rounding
        if not rotate and abs(scale - 1) < 0.1:  # the bound leaves it as it is: no second pass
            scale = 1.0
    return scale


def canvas_pixels(shape: tuple[int, ...], angle: float, scale: float = 1.0) -> float:
    """Pixels of warp's output for an image of `shape` turned by `angle` degrees and scaled."""
    h, w = shape[:2]
    cos, sin = abs(math.cos(math.radians(angle))), abs(math.sin(math.radians(angle)))
    return (w * cos + h * sin) * (w * sin + h * cos) * scale * scale


def turn(quads, angle: float, shape: tuple[int, ...]) -> np.ndarray:
    """Box corners turned clockwise by `angle` degrees about the image centre: the
    boxes as they would lie on the straightened page (for reading order)."""
    q = np.asarray(quads, dtype=np.float64).reshape(-1, 4, 2)
    if not angle:
        return q
    h, w = shape[:2]
    m = cv2.getRotationMatrix2D((w / 2, h / 2), -angle, 1.0)
    return q @ m[:, :2].T + m[:, 2]


def skew_angle(quads: Sequence[Sequence[Sequence[float]]]) -> float:
    """The page's skew in degrees, counter-clockwise positive as seen on the image
    (text rising to the right is positive): the length-weighted median direction
    of the top edges of wide boxes. 0.0 when too few boxes say."""
    q = np.asarray(quads, dtype=np.float64).reshape(-1, 4, 2)
    if len(q) == 0:
        return 0.0
    top = q[:, 1] - q[:, 0]  # detector quads run tl, tr, br, bl
    side = q[:, 3] - q[:, 0]
    length = np.hypot(top[:, 0], top[:, 1])
    height = np.hypot(side[:, 0], side[:, 1])
    usable = (length >= MIN_ASPECT * np.maximum(height, 1e-6)) & (top[:, 0] > 0)
    if usable.sum() < MIN_BOXES:
        return 0.0
    angles = np.degrees(np.arctan2(-top[usable, 1], top[usable, 0]))  # image y runs down
    return _weighted_median(angles, length[usable])


def text_height(quads: Sequence[Sequence[Sequence[float]]]) -> float:
    """Median height of the detected boxes (their short side), in pixels; 0.0 if none."""
    q = np.asarray(quads, dtype=np.float64).reshape(-1, 4, 2)
    if len(q) == 0:
        return 0.0
    side = q[:, 3] - q[:, 0]
    return float(np.median(np.hypot(side[:, 0], side[:, 1])))


def warp(image: np.ndarray, angle: float, scale: float) -> np.ndarray:
    """The image rotated clockwise by `angle` degrees (undoing a skew of `angle`) and
    scaled by `scale`, on a canvas large enough to lose nothing, padded white."""
    h, w = image.shape[:2]
    rad = math.radians(angle)
    cos, sin = abs(math.cos(rad)) * scale, abs(math.sin(rad)) * scale
    out_w, out_h = int(math.ceil(w * cos + h * sin)), int(math.ceil(w * sin + h * cos))
    # cv2: positive angle turns counter-clockwise; -angle undoes a counter-clockwise skew
    m = cv2.getRotationMatrix2D((w / 2, h / 2), -angle, scale)
    m[0, 2] += out_w / 2 - w / 2
    m[1, 2] += out_h / 2 - h / 2
    if angle == 0:
        return cv2.resize(image, (max(1, round(w * scale)), max(1, round(h * scale))),
                          interpolation=cv2.INTER_AREA if scale < 1 else cv2.INTER_LINEAR)
    return cv2.warpAffine(image, m, (out_w, out_h), flags=cv2.INTER_LINEAR,
                          borderMode=cv2.BORDER_CONSTANT, borderValue=(255, 255, 255))


def _weighted_median(values: np.ndarray, weights: np.ndarray) -> float:
    order = np.argsort(values)
    cum = np.cumsum(weights[order])
    return float(values[order][np.searchsorted(cum, cum[-1] / 2)])
