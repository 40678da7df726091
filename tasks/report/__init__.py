"""What a run says: the promotion report, cost and prices, run outcomes, schedules, the work pool."""
