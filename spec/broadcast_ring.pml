/*
 * broadcast_ring.pml -- Spin model of the single-writer, N-reader message
 * ring of src/parallel/broadcast_ring.{h,cpp} (seed 003).  Checked by
 * bash scripts/check-spec.sh.
 *
 * WHAT IS MODELLED
 *   - One writer publishing NMSG messages through NSLOTS slots to NREADERS
 *     readers (NMSG > NSLOTS, so slots are reused and the writer must wait
 *     for slow readers).
 *   - A message is two payload words written one after the other, then the
 *     slot's state (seq + 1).  A reader waits for the state of its next
 *     slot to say its next seq, reads the two words, then stores its count
 *     of messages read (the release).  The writer reuses a slot only once
 *     every reader's count says it has read what the slot holds.
 *   - Sequential consistency stands in for release/acquire: a release store
 *     is ordered after the writes before it, an acquire load before the
 *     reads after it.  The relaxed mutant lets the state store overtake
 *     the payload writes, which is what a relaxed store permits.
 *   - Waiting: a futex word `bell`, bumped after every publish and every
 *     release.  A waiter reads the bell, checks its condition, and only then
 *     sleeps until the bell differs from what it read (FUTEX_WAIT compares
 *     and sleeps atomically: the guard `bell != seen`).  A bounded sleep may
 *     also end by its timeout (TIMEOUTS defined), after which the waiter
 *     checks again.
 *
 * PROPERTIES (assertions, plus Spin's invalid-end-state check = deadlock)
 *   - no torn read: both words of a message read equal its seq;
 *   - no lost message, in order: each reader reads seq 0 .. NMSG-1 in turn
 *     and every process ends;
 *   - no overwrite of an unread slot: a ghost flag per (slot, reader) set at
 *     publish and cleared at release must be clear when the writer writes;
 *   - no deadlock: checked WITHOUT timeouts (TIMEOUTS undefined), so a
 *     run passes only if wake-ups alone always make progress: the bound on a
 *     sleep is a backstop, never what the protocol relies on.  With
 *     TIMEOUTS the safety assertions are checked again.
 *
 * MUTANTS (each must fail)
 *   MUT_NO_RECHECK    the waiter checks, then reads the bell and sleeps on it
 *                     without checking again: a publish between the check
 *                     and the read of the bell is a lost wake-up (deadlock).
 *   MUT_RELAXED_STATE the slot-state store is relaxed: it may become visible
 *                     before the payload words (torn read).
 *   PROBE 1           reachability: the writer finds every slot taken and
 *                     waits (so the passing runs do exercise reuse).
 */

#ifndef NSLOTS
#define NSLOTS 2
#endif
#define NREADERS 2
#ifndef NMSG
#define NMSG 5
#endif

byte state[NSLOTS];               /* seq + 1 of the message held, 0: none */
byte word1[NSLOTS];
byte word2[NSLOTS];
byte nread[NREADERS];             /* messages reader r has released */
byte bell;                        /* the futex word (wraps) */
bool unread[NSLOTS * NREADERS];   /* ghost: slot s not yet released by reader r */

/* Wait until COND: the bell is read before the check (the real code), so a
 * bump after the check wakes the sleep; the mutant reads it after. */
#ifdef MUT_NO_RECHECK
#define WAIT(COND) \
  do \
  :: atomic { (COND) -> break } \
  :: else -> seen = bell; (bell != seen) \
  od
#else
#ifdef TIMEOUTS
#define SLEEP  if :: (bell != seen) -> skip :: true -> skip /* timeout */ fi
#else
#define SLEEP  (bell != seen)
#endif
#define WAIT(COND) \
  do \
  :: seen = bell; \
     if \
     :: atomic { (COND) -> break } \
     :: else -> SLEEP \
     fi \
  od
#endif

#define SLOT_FREE(m)  (nread[0] + NSLOTS > (m) && nread[1] + NSLOTS > (m))

active proctype Writer() {
  byte m = 0;
  byte s;
  byte r;
  byte seen;
  do
  :: m < NMSG ->
     s = m % NSLOTS;
#if PROBE == 1
     if :: !SLOT_FREE(m) -> assert(0) :: else -> skip fi;
#endif
     WAIT(SLOT_FREE(m));
     r = 0;
     do
     :: r < NREADERS -> assert(!unread[s * NREADERS + r]); unread[s * NREADERS + r] = true; r++
     :: else -> break
     od;
#ifdef MUT_RELAXED_STATE
     if
     :: state[s] = m + 1; word1[s] = m + 1; word2[s] = m + 1
     :: word1[s] = m + 1; state[s] = m + 1; word2[s] = m + 1
     :: word1[s] = m + 1; word2[s] = m + 1; state[s] = m + 1
     fi;
#else
     word1[s] = m + 1;
     word2[s] = m + 1;
     state[s] = m + 1;        /* release */
#endif
     bell++;
     m++
  :: else -> break
  od
}

active [NREADERS] proctype Reader() {
  byte me = _pid - 1;
  byte m = 0;
  byte s;
  byte a;
  byte b;
  byte seen;
  do
  :: m < NMSG ->
     s = m % NSLOTS;
     WAIT(state[s] == m + 1);  /* acquire */
     a = word1[s];
     b = word2[s];
     assert(a == m + 1 && b == m + 1);  /* no torn read, nothing lost, in order */
     unread[s * NREADERS + me] = false;
     nread[me] = m + 1;        /* release */
     bell++;
     m++
  :: else -> break
  od;
  assert(nread[me] == NMSG)
}
