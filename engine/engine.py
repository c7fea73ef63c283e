"""Engine: the one entry point — load a model folder for a mode, then run rows through it.

    mode        runs                                    call
    embed       engine.embed.Embedder                   encode / embed
    generate    engine.generate.LLMEngine               generate
    transcribe  engine.whisper.Transcriber              transcribe
    classify    engine.score.Classifier                 classify
    score       engine.score.PairScorer (cross-encoder, yes/no reranker or bi-encoder: the
                folder says, engine.score.head_config.score_method)   score / score_chats
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from engine.cpu_memory import keep_freed_memory
from engine.embed.embedder import Embedder
from engine.embed.outputs import EmbeddingOutput
from engine.embed.params import EmbedParams
from engine.generate import GenerateOptions, GenerationOutput, LLMEngine, SamplingParams
from engine.lora.manager import AdapterSource
from engine.lora.options import LoraOptions
from engine.settings import default_dtype
from engine.quant.config import QUANTIZATIONS   # None, "fp8" (per-channel scales), "fp8-block" (128x128)
from engine.score.outputs import ClassifyResult, ScoreOutput
from engine.score.params import ClassifyParams, ScoreParams
from engine.step_stats import StepObserver
from engine.whisper.params import TranscribeParams

MODES = ("generate", "embed", "transcribe", "classify", "score")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Tokens per forward pass when the caller names no budget. On CPU the FFN's
# [tokens, 4 * hidden] activations should stay in cache, so batches are small; a GPU
# needs many tokens in flight to fill its cores: 64k, so that each launch's fixed host
# cost is spread over enough work (issue 23; BERT-base's FFN activations at 64k tokens
# in fp16 are 400 MB, and an OOM lowers the budget, engine.oom).
DEFAULT_MAX_BATCH_TOKENS = {"cpu": 2048, "cuda": 65536}


class Engine:
    """A loaded model serving one mode. Build it with Engine.from_pretrained."""

    def __init__(self, mode: str, embedder: Embedder | None = None, llm: LLMEngine | None = None,
                 transcriber=None, classifier=None, scorer=None):
        self.mode = mode
        self._embedder = embedder
        self.llm = llm           # the generate mode's engine: options, tokenizer, last_run stats
        self.transcriber = transcriber   # the transcribe mode's engine (engine.whisper.Transcriber)
        self.classifier = classifier     # the classify mode's engine (engine.score.Classifier)
        self.scorer = scorer             # the score mode's engine (engine.score.PairScorer)
        self.device_id: str | None = None   # the worker's device slot ("cuda:3", "cpu:1"), set by the worker

    @classmethod
    def from_pretrained(cls, path: str | Path, mode: str = "embed", dtype: str | torch.dtype | None = None,
                        device: str | torch.device | None = None, max_batch_tokens: int | None = None,
                        quantization: str | None = None, lora: LoraOptions | None = None,
                        **generate_options) -> "Engine":
        """Load a Hugging Face–format folder (config.json, model.safetensors, tokenizer.json),
        or for mode="generate" also a .gguf file; for mode="transcribe" also a CTranslate2
        folder or an openai-whisper .pt; for mode="classify" a *ForSequenceClassification
        folder; for mode="score" whatever engine.score.PairScorer loads (a yes/no reranker's
        generate_options are GenerateOptions). dtype: by default float32 on CPU; on a GPU the
        checkpoint's own 16-bit type (engine.settings.default_dtype), fp16 for
        transcription. generate_options: see GenerateOptions; for "transcribe",
        max_slots and max_admit (engine.whisper.build).

        quantization="fp8" stores linear-layer weights in E4M3 with per-output-channel
        scales, "fp8-block" with 128x128 block scales; embeddings, norms, the LM head and
        attention stay in `dtype`. FP8 checkpoints (`barge quantize`, Qwen3-FP8,
        llm-compressor) load as FP8 whatever is passed here. Transcription runs in 16-bit
        unless quantization is given: then Whisper's encoder and decoder linear layers
        take FP8 weights (engine.whisper.build), its embeddings and convolutions do not.

        lora (mode="generate"): serve PEFT LoRA adapters per request (engine/lora/): each
        generate call names its rows' adapters (generate(..., adapter=))."""
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")
        if lora is not None and mode != "generate":
            raise TypeError(f"lora applies to mode 'generate' only, not {mode!r}")
        if resolve_device(device).type == "cpu":
            keep_freed_memory()     # steps allocate tens of MB each: reuse it, not page-fault it
        if mode == "transcribe":
            return cls._load_transcriber(path, dtype, device, quantization, generate_options)
        dtype = default_dtype(path, resolve_device(device)) if dtype is None else dtype
        if quantization not in QUANTIZATIONS:
            raise ValueError(f"unsupported quantization {quantization!r}; expected one of {QUANTIZATIONS}")
        if mode == "generate":
            options = GenerateOptions(**generate_options)
            return cls(mode, llm=LLMEngine.load(path, resolve_dtype(dtype), resolve_device(device), options,
                                                 quantization, lora))
        device = resolve_device(device)
        if max_batch_tokens is None:     # real (unpadded) tokens per forward pass
            max_batch_tokens = DEFAULT_MAX_BATCH_TOKENS.get(device.type, DEFAULT_MAX_BATCH_TOKENS["cuda"])
        if mode == "score":
            return cls._load_scorer(path, resolve_dtype(dtype), device, max_batch_tokens, quantization,
                                    generate_options)
        if generate_options:
            raise TypeError(f"options {sorted(generate_options)} apply to mode 'generate' only")
        if mode == "classify":
            from engine.score.classifier import Classifier
            return cls(mode, classifier=Classifier.load(path, resolve_dtype(dtype), device, max_batch_tokens,
                                                        quantization))
        embedder = Embedder.load(path, resolve_dtype(dtype), device, max_batch_tokens, quantization)
        return cls(mode, embedder)

    @classmethod
    def _load_scorer(cls, path, dtype: torch.dtype, device: torch.device, max_batch_tokens: int, quantization,
                     options: dict) -> "Engine":
        """generate options size a yes/no reranker's generate engine; other scorers take none."""
        from engine.score.head_config import score_method
        from engine.score.pairs import PairScorer
        method = score_method(path)
        if options and method != "yes-no":
            raise TypeError(f"options {sorted(options)} apply to a yes/no reranker only; {path} is a {method}")
        generate_options = GenerateOptions(**options) if method == "yes-no" else None
        return cls("score", scorer=PairScorer.load(path, dtype, device, max_batch_tokens, quantization,
                                                   generate_options))

    @classmethod
    def _load_transcriber(cls, path, dtype, device, quantization, options: dict) -> "Engine":
        from engine.whisper.build import load_transcriber
        unknown = sorted(set(options) - {"max_slots", "max_admit"})
        if unknown:
            raise TypeError(f"options {unknown} do not apply to mode 'transcribe' (max_slots, max_admit do)")
        device = resolve_device(device)
        if dtype is None:     # ASR models are served in 16-bit; CPUs are fast only in fp32
            dtype = "float16" if device.type == "cuda" else "float32"
        transcriber = load_transcriber(path, resolve_dtype(dtype), device, quantization=quantization, **options)
        return cls("transcribe", transcriber=transcriber)

    def transcribe(self, audio: list, params: TranscribeParams | None = None, **options) -> list:
        """One TranscriptionOutput per input (float32 16 kHz array, bytes, path or fsspec
        URL) in input order: .text, .segments (start, end, text; with word_timestamps also
        .words: word, start, end, probability), .language (.language_probability when
        detected), .duration_s, .error (undecodable or empty audio is such a row).

        params: a TranscribeParams, or its fields as keywords (language=, task=,
        temperature=, beam_size=, vad=, with_timestamps=, word_timestamps=, long_form=);
        a bad value raises ValueError naming it."""
        if self.transcriber is None:
            raise ValueError(f"transcribe needs an engine loaded with mode='transcribe', not {self.mode!r}")
        return self.transcriber.transcribe(list(audio), _params(TranscribeParams, params, options))

    @property
    def settings(self) -> dict:
        """What this engine runs with, as plain JSON-able values (a fresh dict each call):
        mode, dtype, device (a type: "cpu", "cuda"; on a GPU also device_name) and
        quantization (None, "fp8", "fp8-block"), then the mode's limits —
        generate: max_num_seqs, max_num_batched_tokens, max_model_len, block_size,
        num_kv_blocks, kv_cache_dtype (the model's, or "float8_e4m3fn" where
        kv_cache_dtype="fp8" was asked), enable_prefix_caching; embed: max_batch_tokens,
        max_seq_length; transcribe: max_slots, max_admit. A worker's engine also has device_id, the
        device slot its process serves ("cuda:3", "cpu:1"; queueing.devices)."""
        settings = {"mode": self.mode, **self._mode_engine.settings}
        if self.device_id is not None:
            settings["device_id"] = self.device_id
        return settings

    def add_step_observer(self, observer: StepObserver) -> None:
        """Call `observer(StepStats)` after each step is scheduled — generate: a scheduler
        step; embed: a forward batch; transcribe: a decoder step (engine.step_stats).
        It runs on the engine's thread, so it must be quick and must not raise."""
        self._mode_engine.step_observers.append(observer)

    @property
    def _mode_engine(self):
        """The object that runs this mode's steps: Embedder, LLMEngine, ChunkDecoder,
        Classifier or PairScorer."""
        if self.mode == "embed":
            return self._embedder
        if self.mode == "generate":
            return self.llm
        if self.mode == "classify":
            return self.classifier
        if self.mode == "score":
            return self.scorer
        return self.transcriber.decoder

    @property
    def model_name(self) -> str:
        return self._embedder.config.model_name

    @property
    def embedding_dim(self) -> int:
        return self._embedder.embedding_dim

    @property
    def max_seq_length(self) -> int:
        return self._embedder.config.max_seq_length

    def generate(self, prompts: list, params: SamplingParams | list[SamplingParams] | None = None,
                 adapter: AdapterSource | list[AdapterSource] = None) -> list[GenerationOutput]:
        """One GenerationOutput per prompt (text, token ids or chat messages) in input order;
        bad rows carry .error; a bad SamplingParams value raises ValueError naming it.
        adapter: a LoRA adapter folder or URL for every prompt, or one per prompt (None: the
        base model); the engine must be loaded with lora=LoraOptions(...). A row whose
        adapter cannot serve carries that as its .error."""
        if self.llm is None:
            raise ValueError(f"generate needs an engine loaded with mode='generate', not {self.mode!r}")
        return self.llm.generate(prompts, params, adapter)

    @property
    def max_batch_tokens(self) -> int:
        return self._embedder.max_batch_tokens

    def num_tokens(self, texts: list[str], truncate: bool = True) -> list[int]:
        """Tokens each text would feed the model, special tokens included."""
        return [len(ids) for ids in self._embedder.tokenizer.encode_batch(texts, truncate)]

    def embed(self, texts: list[str], params: EmbedParams | None = None, **options) -> np.ndarray:
        """[len(texts), dimensions or embedding_dim] in input order; ValueError naming a bad row.

        params: an EmbedParams, or its fields as keywords (dimensions=, normalize=,
        truncate=, output_dtype=, prompt=, prompt_name=). truncate=False refuses (raises
        for) a text longer than max_seq_length instead of cutting it; output_dtype is
        "float32" or "float16". prompt is put before every text (an instruction:
        Qwen3-Embedding wants "Instruct: {task}\nQuery:" before queries); prompt_name picks
        one of the model's named prompts instead. Both count towards max_seq_length, as in
        sentence-transformers.
        """
        return self._embedder.embed(texts, _params(EmbedParams, params, options))

    def encode(self, texts: list, params: EmbedParams | None = None, **options) -> list[EmbeddingOutput]:
        """One EmbeddingOutput per text in input order; bad rows carry .error instead of raising.

        With truncate=False a text over max_seq_length is such a row: its error names
        its token count and the limit. params (or its fields as keywords) are embed's.
        """
        return self._embedder.encode(texts, _params(EmbedParams, params, options))


    def classify(self, rows: list, params: ClassifyParams | None = None, **options) -> list[ClassifyResult]:
        """One ClassifyResult per row in input order (.label, .score, .labels, .scores with
        return_all_scores, .num_tokens); bad rows carry .error. A row is a text, a pair of
        texts, or chat messages (a reward model's conversation). params (or its fields as
        keywords): truncate=, activation=, threshold=, return_all_scores=."""
        if self.classifier is None:
            raise ValueError(f"classify needs an engine loaded with mode='classify', not {self.mode!r}")
        return self.classifier.classify(list(rows), _params(ClassifyParams, params, options))

    def score(self, queries: list, documents: list, params: ScoreParams | None = None,
              **options) -> list[ScoreOutput]:
        """One ScoreOutput per (query, document) pair in input order, higher is more
        relevant; bad pairs (a null text, one over the model's length with truncate=False)
        carry .error. params (or its fields as keywords): ScoreParams'."""
        if self.scorer is None:
            raise ValueError(f"score needs an engine loaded with mode='score', not {self.mode!r}")
        return self.scorer.score_rows(list(queries), list(documents), _params(ScoreParams, params, options))

    def score_chats(self, chats: list, params: ScoreParams | None = None, **options) -> list[ScoreOutput]:
        """A reward model's score of each conversation (chat messages through the folder's
        chat template): the raw value of its one-label head unless params.activation says
        otherwise. ValueError for a model that is not a one-label sequence classifier."""
        if self.scorer is None:
            raise ValueError(f"score needs an engine loaded with mode='score', not {self.mode!r}")
        params = _params(ScoreParams, params, options)
        if self.scorer.method != "cross-encoder" or self.scorer.model.head.num_labels != 1:
            raise ValueError("scoring chats needs a one-label sequence classifier (a reward model), not a "
                             f"{self.scorer.method}")
        results = self.scorer.model.classify(list(chats), ClassifyParams(truncate=params.truncate,
                                                                         activation=params.activation))
        return [ScoreOutput(result.score, result.num_tokens, result.error) for result in results]


def _params(kind: type, params: object | None, options: dict):
    """`params` (a `kind`), or a `kind` built from the keywords `options`; not both."""
    if params is None:
        return kind(**options)
    if options:
        raise TypeError(f"give a {kind.__name__} or its fields as keywords ({', '.join(sorted(options))}), not both")
    if not isinstance(params, kind):
        raise TypeError(f"params must be a {kind.__name__}, got {type(params).__name__}")
    return params


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"unsupported dtype {dtype!r}; expected one of {tuple(DTYPES)}")
    return DTYPES[dtype]


def resolve_device(device: str | torch.device | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)
