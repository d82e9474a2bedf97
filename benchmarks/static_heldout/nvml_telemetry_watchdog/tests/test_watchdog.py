from telemetry.watchdog import Watchdog


def test_beat_records_progress():
    wd = Watchdog(timeout_s=5.0)
    wd.beat(1, 3.0)
    assert wd.last_step == 1  # ok: FC109
