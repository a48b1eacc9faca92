"""Pure time: schedules, calendars, cron in words, due keys, pauses and skips."""
