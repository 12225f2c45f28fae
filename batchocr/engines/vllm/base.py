"""What every vLLM engine of a run is to the pipeline, one engine or several sharing a GPU."""

from __future__ import annotations

from typing import Any

from batchocr.cost import visible_gpus
from batchocr.engines import Engine
from batchocr.engines.vllm.options import VLLMOptions, render_hints
from batchocr.engines.vllm.presets import get_preset
from batchocr.schema import Needs


class VLLMBase(Engine):
    """The options, the preset and what the pipeline reads of them."""

    name = "vllm"

    def __init__(self, options: VLLMOptions):
        self.options = options
        self.preset = get_preset(options.preset)
        self.needs = Needs(image=True, upright=options.orientation_model())
        self.model = options.model
        self.group_pages = options.group_size(self.preset)
        self.admit_pages = options.admit_size(self.preset)

    @property
    def accelerator(self) -> dict[str, Any]:
        """The GPUs this run holds (the pod's), for its cost record (batchocr/cost.py)."""
        return visible_gpus()

    @property
    def render_hints(self) -> dict[str, int]:
        """The page size the model wants: the pipeline renders to it."""
        return render_hints(self.preset)
