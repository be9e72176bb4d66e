"""The Configure screen: a form for every RunConfig setting, presets, and Launch."""
