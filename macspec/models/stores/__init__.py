"""Where models already lie on this machine: Ollama's store, LM Studio's, the Hugging Face cache.

Store names resolve to paths (a GGUF file or an MLX folder) that the ordinary loader takes;
nothing in a store is copied or changed.
"""

from macspec.models.stores.entry import StoreModel, is_gguf
from macspec.models.stores.names import FORMS, find, is_store_name, not_a_model

__all__ = ["FORMS", "StoreModel", "find", "is_gguf", "is_store_name", "not_a_model"]
