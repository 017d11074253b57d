"""The language model: loading it by name (embedded GGUF, folder, file, hub), the forward
hooks on its blocks, and the corpora it is run on."""
