"""Where the tokens come from: synthetic, local text and prepared token sources, reading documents, and preparing a
corpus once into memory-mapped shards."""
