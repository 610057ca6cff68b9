"""The autoscaler service: the AutoScaler (scaler.py, fed by metrics.py) and the
schedule-window controller (windows.py), both leader-only (service.py)."""
