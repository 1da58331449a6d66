"""``backend: megatron``: Qwen3 on Megatron-core (:mod:`.backend`), the HF <-> Megatron converter (:mod:`.convert`),
the model and its packed-rows wrapper (:mod:`.model`) and the CPU patches (:mod:`.cpu_patches`).

Nothing here imports megatron-core at module level except :mod:`.model`'s functions when called: the trainer
starts, and the validator can say that megatron-core is missing, without it.
"""
