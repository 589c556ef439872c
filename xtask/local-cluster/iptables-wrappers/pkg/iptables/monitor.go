package iptables

import (
	"context"
	"time"
)

// How long Monitor waits, polling every flushPoll, for the canaries of the other tables to go
// once the first table's is gone (a flush of several tables is not atomic); variables so that
// tests can shorten them.
var (
	flushTimeout = 5 * time.Second
	flushPoll    = 100 * time.Millisecond
)

// canaryCleanupTimeout bounds the deletion of the canaries when Monitor returns.
const canaryCleanupTimeout = 10 * time.Second

// Monitor implements Interface.
func (r *runner) Monitor(ctx context.Context, canary Chain, tables []Table, reloadFunc func(), interval time.Duration) {
	if len(tables) == 0 {
		return
	}
	defer r.deleteCanaries(context.WithoutCancel(ctx), canary, tables)
	for {
		created := func() bool {
			for _, table := range tables {
				if _, err := r.EnsureChain(ctx, table, canary); err != nil {
					return false
				}
			}
			return true
		}
		if !pollUntil(ctx, interval, true, created) {
			return
		}
		flushed := func() bool { return r.canaryGone(ctx, tables[0], canary) }
		if !pollUntil(ctx, interval, false, flushed) {
			return
		}
		// Let the flush reach the other tables before reloading, so that the reload does not
		// race with it; after flushTimeout, reload anyway.
		waitCtx, cancel := context.WithTimeout(ctx, flushTimeout)
		pollUntil(waitCtx, flushPoll, true, func() bool {
			for _, table := range tables[1:] {
				if !r.canaryGone(waitCtx, table, canary) {
					return false
				}
			}
			return true
		})
		cancel()
		if ctx.Err() != nil {
			return
		}
		reloadFunc()
	}
}

// canaryGone says whether canary is known to be missing from table: false when it exists or when
// iptables could not tell (e.g. it timed out waiting for the xtables lock).
func (r *runner) canaryGone(ctx context.Context, table Table, canary Chain) bool {
	exists, err := r.ChainExists(ctx, table, canary)
	if exists || ctx.Err() != nil {
		return false
	}
	return !isResourceError(err)
}

// deleteCanaries deletes canary from each table, ignoring errors: it may be gone already.
func (r *runner) deleteCanaries(ctx context.Context, canary Chain, tables []Table) {
	ctx, cancel := context.WithTimeout(ctx, canaryCleanupTimeout)
	defer cancel()
	for _, table := range tables {
		_ = r.DeleteChain(ctx, table, canary)
	}
}

// pollUntil calls condition every interval (and first at once when immediate) until it returns
// true, then returns true; false when ctx is done first.
func pollUntil(ctx context.Context, interval time.Duration, immediate bool, condition func() bool) bool {
	if immediate && ctx.Err() == nil && condition() {
		return true
	}
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-ticker.C:
			if condition() {
				return true
			}
		}
	}
}
