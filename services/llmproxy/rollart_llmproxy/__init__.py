"""RollArt LLMProxy: the generation gateway between environment loops and actors."""
