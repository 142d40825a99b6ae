"""Launcher side of fedshard: reports that set sweep results beside the paper's."""
