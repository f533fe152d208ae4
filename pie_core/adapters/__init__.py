"""LoRA adapters in the core: the per-user store, PEFT files, and the zo (evolution strategies) rule."""
