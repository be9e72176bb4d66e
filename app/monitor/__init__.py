"""The Monitor screen: watch one run live or review a finished one."""
