"""The autoscaler's leader-only loops, one module each: the AutoScaler (scaler.py), the
schedule-window controller (windows.py) and idle sleep (idle_sleep.py)."""
