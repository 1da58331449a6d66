from .core import average_word_length, line_count, word_count

__all__ = ["average_word_length", "line_count", "word_count"]
