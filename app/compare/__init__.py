"""The Compare screen: strategies (or any runs) side by side."""
