"""What a sweep directory keeps besides its runs: the manifest (run -> job -> state), registered predictions, the
command that made it, the declared target, and the lock that keeps one launcher on it."""
