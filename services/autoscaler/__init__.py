"""The AutoScaler service's package: today the schedule-window controller (windows.py);
the AutoScaler proper is not built yet (docs/status.md)."""
