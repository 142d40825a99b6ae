"""The launcher: settings (config) -> sweep -> planning (placement, prediction) -> an action (launcher.actions: run
submits and waits, plan, report...) over a small core; records/ holds what a sweep directory keeps."""
