"""The depth monitor: samples the queue, raises and clears alarms, acts through rq jobs."""
