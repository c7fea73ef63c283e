"""LoRA adapters on a generate engine's base model: many adapters in one batch.

    adapter_config.py  the PEFT adapter_config.json, read and checked (torch-free: submit checks it)
    adapter_shapes.py  an adapter's tensor names and shapes from its safetensors header, against a
                       base's config.json (torch-free: submit checks it, jobs.adapters)
    adapter.py         LoraAdapter: an adapter's tensors, checked against the base model's shapes
    options.py         LoraOptions: max_loras, max_lora_rank, the host cache's size
    slots.py           which adapter sits in which of the max_loras device slots (LRU; pure)
    batch.py           LoraBatch: each token's slot, grouped, built once per step
    weights.py         the slots' weights per linear, and the grouped shrink/expand on CPU
    triton_ops.py      the grouped shrink/expand as Triton kernels (CUDA; the interpreter in tests)
    linear.py          LoraLinear: a base linear plus the step's adapters' deltas
    manager.py         LoraManager: loads adapters (the next wave's on a prefetch thread), fills
                       slots, wraps the model
    gate.py            the scheduler's admission rule: at most max_loras adapters running
    waves.py           a LoRA job's row order: waves of max_loras adapters, prefix order within
                       each adapter (pure; the worker's generate feed uses it)

Nothing here is imported by the engine unless the engine is built with LoraOptions.
"""
