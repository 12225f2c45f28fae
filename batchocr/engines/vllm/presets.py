"""Model presets for the vLLM engine: one small function per OCR VLM, as in vLLM's
offline examples. A preset knows the model's prompt, the image size it wants
(pages are rendered to it, so vLLM's processor has nothing to resize), its
sampling defaults and the engine arguments it needs."""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from batchocr import grounding
from batchocr.engines.vllm.patches import ngram
from batchocr.errors import ConfigError

# The Qwen-VL family's chat format with one image before the instruction.
QWEN_TEMPLATE = (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>{instruction}<|im_end|>\n"
    "<|im_start|>assistant\n"
)

PLAIN_OCR = (
    "Read all the text on this page and return it as plain text in natural reading order. "
    "Return only the text of the page."
)

OLMOCR_INSTRUCTION = (
    "Attached is one page of a document that you must process. Just return the plain text "
    "representation of this document as if you were reading it naturally. Convert equations "
    "to LaTeX and tables to HTML.\nIf there are any figures or charts, label them with the "
    "following markdown syntax ![Alt text describing the contents of the figure]"
    "(page_startx_starty_width_height.png)\nReturn your output as markdown, with a front matter "
    "section on top specifying values for the primary_language, is_rotation_valid, "
    "rotation_correction, is_table, and is_diagram parameters."
)


def _identity(text: str) -> str:
    return text


def strip_front_matter(text: str) -> str:
    """olmOCR answers with a YAML front matter block before the page text."""
    match = re.match(r"\A---\s*\n.*?\n---\s*\n?", text, re.S)
    return text[match.end():] if match else text


@dataclass(frozen=True)
class Preset:
    name: str
    # The prompt, with the model's image placeholder; {instruction} is filled in.
    template: str
    instruction: str
    # Pages are rendered so that the longest side is at most max_side pixels and
    # both sides are multiples of size_multiple (patch size x spatial merge).
    max_side: int
    size_multiple: int
    max_tokens: int
    temperature: float
    max_model_len: int
    # Temperatures for retries of a page whose output loops (olmOCR's ladder).
    retry_temperatures: tuple[float, ...] = (0.2, 0.4, 0.8)
    mm_processor_kwargs: dict[str, Any] = field(default_factory=dict)
    # engines.vllm.admit_pages where the user sets none, in page mode: requests added together
    # once this many sequences are free (0: as vLLM admits them). Set from GPU runs at equal work.
    admit_pages: int = 0
    # engines.vllm.group_pages where the user sets none, in document mode: pages a group holds at
    # most (0: as many as the context allows). Set from GPU runs at equal work.
    group_pages: int = 0
    # engines.vllm.batch_encoder where the user sets none (unlimited-ocr, deepseek-ocr only):
    # patches.deepencoder's encoder over a step's pages at once. Set from GPU runs at equal work.
    batch_encoder: bool = False
    # engines.vllm.pixel_bytes where the user sets none (with the batched encoder only):
    # patches.pixels' views handed over as bytes. Set from GPU runs (the same input, less host memory).
    pixel_bytes: bool = False
    # engines.vllm.sam_fold where the user sets none (with the batched encoder only): patches.samattn's
    # SAM attention with its bias folded in. Set from GPU runs at equal work.
    sam_fold: bool = False
    # engines.vllm.rswa_tiles where the user sets none, in either mode (unlimited-ocr only):
    # patches.rswa_tiles' attention over the KV tiles R-SWA can see. Set from GPU runs at equal work.
    rswa_tiles: bool = False
    # engines.vllm.vit_pad where the user sets none (Qwen2.5-VL's tower only): patches.vitpad's
    # vision MLPs padded to an aligned size. Set from GPU runs at equal work.
    vit_pad: bool = False
    # GPU memory (GiB) one process of this model needs at the preset's settings (weights,
    # activations and graphs, the KV of max_num_seqs pages), set where one engine cannot keep a
    # GPU busy (its engine core's host work a step is the limit, measured): `processes: auto`
    # runs as many as the card holds (engines/vllm/processes.py). None: one engine fills a GPU.
    process_gib: float | None = None
    # GPU memory (GiB) an engine of this model takes while it runs beyond what vLLM's start-up
    # profile counted (and gpu_memory_utilization bounds): several engines on one GPU leave it
    # to each but the first (`engines.vllm.shared`), as one engine's is left to the GPU's
    # memory beyond gpu_memory_utilization.
    beyond_profile_gib: float = 0.0
    # GPU memory (GiB) an engine of this model holds besides its KV cache in page mode at
    # VLLMOptions' default max_num_batched_tokens and max_num_seqs, as vLLM's start log counts
    # it (weights, peak activation, non-torch memory, CUDA graphs), with room for nvidia-smi's
    # total exceeding CUDA's. Set, the parts of `processes` N each get the KV their share leaves
    # (`engines.vllm.shared`), so that no engine measures free memory (where one would count a
    # running engine's growth as its own use, and take less KV) and the parts build at once.
    non_kv_gib: float | None = None
    engine_args: dict[str, Any] = field(default_factory=dict)
    sampling_args: dict[str, Any] = field(default_factory=dict)
    postprocess: Callable[[str], str] = _identity
    # Document mode (engines.vllm.mode: document): a document's pages in one request, the
    # model writing `document_separator` between pages. None: the model reads one page a request.
    document_template: str | None = None  # {images}: one image placeholder per page
    document_instruction: str | None = None
    document_separator: str = "<page>"  # matched in any case: the reference code splits on <PAGE>
    image_placeholder: str = ""  # what {images} repeats, once a page
    # Prompt tokens a page costs in document mode (its image, base view), for grouping.
    document_page_tokens: int = 0
    document_sampling_args: dict[str, Any] = field(default_factory=dict)  # over sampling_args
    # The processor's arguments for a document request (a request's own mm_processor_kwargs).
    document_mm_processor_kwargs: dict[str, Any] = field(default_factory=dict)
    # For models that write their layout: (raw answer, page width, page height in
    # pixels) -> (Markdown text, blocks) (batchocr.grounding.parse); None: postprocess,
    # and no blocks.
    parse: Callable[[str, int, int], tuple[str, list[dict] | None]] | None = None

    def prompt(self, instruction: str | None = None) -> str:
        return self.template.format(instruction=instruction or self.instruction)

    def document_prompt(self, pages: int, instruction: str | None = None) -> str:
        if self.document_template is None:
            raise ConfigError(f"preset {self.name} reads one page a request: document mode needs a preset "
                              f"that reads whole documents ({', '.join(document_presets())})")
        return self.document_template.format(images=self.image_placeholder * pages,
                                             instruction=instruction or self.document_instruction)

    def read(self, raw: str, width: int, height: int) -> tuple[str, list[dict] | None]:
        """The page's text and layout blocks from the model's answer for a page image
        of width x height pixels."""
        if self.parse is not None:
            return self.parse(raw, width, height)
        return self.postprocess(raw), None


def _qwen(name: str, instruction: str, max_side: int, multiple: int, **kw: Any) -> Preset:
    """A Qwen-VL chat preset. The processor's pixel bounds follow the page size: its
    default max_pixels (1,003,520) would shrink a 1288-px page again (to ~1,280
    tokens), so the whole rendered page is let through."""
    return Preset(name, QWEN_TEMPLATE, instruction, max_side=max_side, size_multiple=multiple,
                  mm_processor_kwargs={"min_pixels": 4 * multiple * multiple, "max_pixels": max_side * max_side},
                  **kw)


# Qwen2.5-VL-7B's layout admitting 16 pages at a time: more pages/s end to end and steady than
# vLLM's own admission, at equal work (measured figures: docs/PERFORMANCE.md)
QWEN25_ADMIT = 16
# Qwen2.5-VL's vision blocks compiled by vLLM (Inductor fuses the eager RMSNorms' elementwise
# kernels): more pages/s in the steady state and end to end at equal work, for ~30 s more to build
# and ~8 s more to the first row from a cold compile cache. vLLM compiles only Qwen2.5-VL's encoder
# among these presets (its `should_torch_compile_mm_vit`), so only theirs.
QWEN25_ENGINE_ARGS = {"compilation_config": {"compile_mm_encoder": True}}


def qwen2_5_vl() -> Preset:
    return _qwen("qwen2.5-vl", PLAIN_OCR, 1288, 28, max_tokens=4096, temperature=0.0, max_model_len=8192,
                 admit_pages=QWEN25_ADMIT, engine_args=copy.deepcopy(QWEN25_ENGINE_ARGS))


def qwen3_vl() -> Preset:
    # Qwen3-VL: patch 16, spatial merge 2.
    return _qwen("qwen3-vl", PLAIN_OCR, 1280, 32, max_tokens=4096, temperature=0.0, max_model_len=8192)


def olmocr_2() -> Preset:
    # allenai/olmOCR-2-7B-1025 (Qwen2.5-VL-7B fine-tune): 1288 px longest side,
    # temperature 0.1, retries at rising temperatures when the output loops.
    # The same layout as qwen2.5-vl's, so its admission and compiled vision blocks too.
    return _qwen("olmocr-2", OLMOCR_INSTRUCTION, 1288, 28, max_tokens=8000, temperature=0.1, max_model_len=16384,
                 retry_temperatures=(0.2, 0.3, 0.5, 0.8), postprocess=strip_front_matter, admit_pages=QWEN25_ADMIT,
                 engine_args=copy.deepcopy(QWEN25_ENGINE_ARGS))


def paddleocr_vl() -> Preset:
    # PaddlePaddle/PaddleOCR-VL (0.9B, ERNIE-4.5 + NaViT encoder); task prompt "OCR:".
    return Preset("paddleocr-vl",
                  "<|begin_of_sentence|>User: <|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|>{instruction}\nAssistant: ",
                  "OCR:", max_side=1596, size_multiple=28, max_tokens=4096, temperature=0.0,
                  max_model_len=16384, engine_args={"trust_remote_code": True})


def deepseek_ocr() -> Preset:
    # deepseek-ai/DeepSeek-OCR: vLLM's recipe bans repeated 30-grams in a 90-token
    # window (table tags whitelisted); patches.ngram bans the same tokens as vLLM's
    # NGramPerReqLogitsProcessor, with its request arguments, at 7-90x less host time a
    # step. Its answer is parsed for layout blocks, which a grounding prompt asks for
    # ("<|grounding|>Convert the document to markdown."); "Free OCR." gives none.
    return Preset("deepseek-ocr", "<image>\n{instruction}", "Free OCR.", max_side=1024, size_multiple=16,
                  max_tokens=8192, temperature=0.0, max_model_len=8192,
                  engine_args={"logits_processors": [ngram.FQCN]},
                  sampling_args={"skip_special_tokens": False, "extra_args": {
                      "ngram_size": 30, "window_size": 90, "whitelist_token_ids": [128821, 128822]}},
                  parse=grounding.parse)


def dots_ocr() -> Preset:
    # rednote-hilab/dots.ocr: the plain-text OCR task prompt.
    return Preset("dots-ocr", "<|img|><|imgpad|><|endofimg|>{instruction}",
                  "Extract the text content from this image.", max_side=1596, size_multiple=28,
                  max_tokens=8192, temperature=0.1, max_model_len=16384,
                  engine_args={"trust_remote_code": True})


def unlimited_ocr() -> Preset:
    # baidu/Unlimited-OCR (the course's model; ../shared/notes/unlimited-ocr.md), vLLM's recipe:
    # no chat template, the prompt starts with a literal <image>; greedy; the no-repeat n-gram
    # bans (35-grams in a 128-token window, 1024 for whole documents) through an engine argument,
    # patches.ngram's processor in place of vLLM's (the same bans, far less host time a step);
    # special tokens kept, since the grounding tags are the layout.
    # Page mode is "gundam" (the 1024 global view + up to 32 crops of 640, tiled from the page's
    # size); document mode is base mode only (vLLM's processor turns crops off for several images):
    # a page is then 16 x 17 + 1 = 273 image tokens.
    return Preset("unlimited-ocr", "<image>{instruction}", "document parsing.", max_side=1920, size_multiple=16,
                  max_tokens=8192, temperature=0.0, max_model_len=32768,
                  engine_args={"logits_processors": [ngram.FQCN]},
                  sampling_args={"skip_special_tokens": False, "extra_args": {"ngram_size": 35, "window_size": 128}},
                  # a prefill step's fixed cost is paid once a step, not once a page: 16 pages
                  # admitted together are faster end to end at equal work
                  admit_pages=16,
                  # the step's pages through SAM/CLIP together (patches.deepencoder): faster end to end
                  # and in the steady state at equal work, the same embeddings in bf16
                  batch_encoder=True,
                  # the views as bytes (patches.pixels): the same model input value for value, half
                  # the bytes a page to the engine core, less host memory at equal work
                  pixel_bytes=True,
                  # SAM's bias folded into its attention (patches.samattn): the flash kernel, not a
                  # bias of heads x tokens^2; faster end to end at equal work, the same embeddings
                  # within bf16's rounding
                  sam_fold=True,
                  # attention reading only the KV tiles R-SWA can see (patches.rswa_tiles): faster end
                  # to end and in the steady state at equal work, the same output
                  rswa_tiles=True,
                  # document mode in groups of 4 pages: no slower than page mode end to end at equal work;
                  # the groups the context allows (8 of a 16-page document) were slower than page mode
                  group_pages=4,
                  # one engine leaves a GPU half idle: its engine core is the limit. A process holds
                  # 11 GiB besides its KV, and 256 sequences' KV peaked at 16.5 GB (docs/PERFORMANCE.md):
                  # 30 GiB a process, so 2 on an 80 GB card, 3 on a 141 GB one
                  process_gib=30,
                  # two engines at 0.45 each of an 80 GB card peaked at 38.8 and 40.1 GiB against
                  # their 35.6 (docs/PERFORMANCE.md)
                  beyond_profile_gib=5,
                  # vLLM counted 11.1 GiB besides the KV (docs/PERFORMANCE.md)
                  non_kv_gib=11.5,
                  document_template="{images}{instruction}", document_instruction="Multi page parsing.",
                  image_placeholder="<image>", document_page_tokens=273,
                  document_sampling_args={"extra_args": {"ngram_size": 35, "window_size": 1024}},
                  # base mode's 1024 view: vLLM 0.26 keeps gundam's image_size 640 for a request of
                  # several images, squeezing each page to 640x640 (small print is then misread: a CER
                  # proxy of 0.089 at 6 pt against 0.000 at 1024, the same 273 tokens a page)
                  document_mm_processor_kwargs={"image_size": 1024},
                  parse=grounding.parse)


PRESETS: dict[str, Callable[[], Preset]] = {
    "qwen2.5-vl": qwen2_5_vl,
    "qwen3-vl": qwen3_vl,
    "olmocr-2": olmocr_2,
    "paddleocr-vl": paddleocr_vl,
    "deepseek-ocr": deepseek_ocr,
    "dots-ocr": dots_ocr,
    "unlimited-ocr": unlimited_ocr,
}


def document_presets() -> list[str]:
    return [name for name, make in PRESETS.items() if make().document_template is not None]


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise ConfigError(f"unknown vLLM preset {name!r}; choose one of {', '.join(PRESETS)}")
    return PRESETS[name]()
