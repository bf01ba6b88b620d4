/*
 * pd_transfer.pml -- Spin model of ONE prefill/decode KV transfer, both modes
 * (docs/PD_PROTOCOL.md).  Check everything with: bash scripts/check-spec.sh
 * State names are those of src/pd: PrefillAwaitingAddresses = kAwaitingAddresses
 * of PrefillState, DecodeQuarantined = kQuarantined of DecodeState, ...
 *
 * WHAT IS MODELLED
 *   - One router, one prefill instance P, one decode instance D, one transfer
 *     with transfer id TID.  Mode WRITE (push) or READ (pull): -DMODE_WRITE or
 *     -DMODE_READ at spin -a time, else chosen nondeterministically at start.
 *   - D forks TWO siblings (parallel sampling) from the one transfer; each
 *     sibling finishes or is ended by the transfer's end; D frees the
 *     transfer's blocks only when both have left the transfer's sibling set.
 *   - Six directed channels: router<->P, router<->D, P<->D.  Every channel is
 *     lossy, duplicating and reordering: at most MAXFAULTS faults per run, each
 *     one a lost message, a duplicated message (a copy arrives again later) or
 *     a message overtaken by the one behind it (faults are injected when the
 *     head of a channel is received, which is equivalent to in flight).
 *   - Retransmission: every message except Ack is retransmitted until acked
 *     or the peer is declared dead.  The retransmit timer is a "perfect
 *     timer": a resend is enabled only while the message is unacked and
 *     neither a copy of it nor its answer (Ack, or a tombstone's Release) is
 *     in flight, i.e. after a loss or a silent drop.  A premature resend is a
 *     duplicate, covered by the duplicate fault.  Unbounded, but it fires only
 *     after a loss, so liveness can still be proven with bounded faults.
 *   - Disruptions: at start any subset of at most MAXDISRUPT of them is
 *     armed (all subsets are explored); an armed one fires at a
 *     nondeterministic moment: client abort, request deadline, prefill
 *     crash, decode crash, the prefill's local failure to post the RMA write
 *     (WRITE; it fails when the write is posted).  The deadline
 *     is one event on the router's clock (the router fails the request and
 *     sends Abort); after it each instance may also end at its own deadline,
 *     independently, at any later moment.
 *   - Crash: the node stops for ever and its memory is gone (its blocks and
 *     exposures vanish, messages to it vanish).  An RMA it had in flight is
 *     an orphan NIC operation that may still land later unless the target
 *     has fenced it.  Each survivor (and the router) declares it dead later,
 *     independently (lease expiry).
 *   - Fencing (docs/PD_PROTOCOL.md, "Fencing"): there is no per-transfer
 *     revoke.  A survivor whose blocks are exposed to the dead peer asks for
 *     a fence of that peer (FencePeer) and keeps the blocks quarantined; the
 *     fence completes at a nondeterministic later moment (Env), and only then
 *     may the exposure end and the blocks be freed.  An RMA of the peer that
 *     arrives before the fence completes lands; after, it fails.
 *   - Blocks, per side: held / exposed to the peer / RMA in flight.  An RMA
 *     of an unfenced, live-or-orphaned peer must find its target exposed and
 *     held (asserted), never freed.
 *   - Tombstones (kEnded) live on: Start/Abort/Release are acked; the peer's
 *     RemoteBlocks / KvAddresses / WriteDone are answered with Release
 *     instead of an Ack (so the peer retransmits until a Release gets
 *     through); a Release or an Ack is never answered with a Release (two
 *     tombstones would ping-pong).
 *   - A peer message for a transfer the receiver has not seen yet (it overtook
 *     the router's Start) stays in the channel until the Start arrives: the
 *     same as "dropped as unknown, retransmitted later".
 *
 * WHAT IS ABSTRACTED AWAY
 *   - Block ids and counts, partial prefix hits and the prefix cache, the
 *     recurrent-state slot, zero-block transfers, token contents: each side's
 *     blocks are one unit with the three flags above.
 *   - Many transfers, many instances, admission by credits (the router
 *     dispatches at once or the client aborts while queued), the router's
 *     own crash.
 *   - Epochs and restarts: a crashed node never comes back.  A restart in a
 *     new epoch is the same for the transfer (its messages are stale_epoch,
 *     the old epoch is declared dead as soon as the new one is heard).
 *   - Heartbeats: each observer's lease expiry is one event, and it happens
 *     only after a real crash (no false suspicion of a live but slow or
 *     partitioned peer).
 *   - Timing values (retransmit interval, lease_ms, tombstone_ttl_ms, the
 *     deadline): tombstones never expire, max_retransmits is never reached
 *     (faults are bounded), the deadline is an event.
 *   - The Ack between the router and an instance: the sender's "unacked"
 *     flag is cleared when the receiver handles the message (a lost Ack is the
 *     same as a duplicate, which the faults between the instances cover).
 *   - Outcome reasons (only completed / failed), the wrong_peer check, drop
 *     counters.
 *
 * PROPERTIES
 *   - Assertions: blocks are freed only when not exposed to the peer and no
 *     RMA (the peer's or our own) can touch them; stop-exposing without a
 *     revoke only when the peer has no RMA in flight; no double free; the
 *     RMA write lands only in held decode blocks, the RMA read reads only
 *     held prefill blocks; decoding starts only on the complete KV; every
 *     message carries the shared transfer id TID, never the decode-local id
 *     DLOCAL; each sibling belongs to the one transfer and its blocks are not
 *     freed under it; the router fails a request only after a real
 *     disruption (never because of network faults alone); no channel
 *     overflows (QSZ).
 *   - No invalid end state: every process ends idle, in a tombstone, crashed
 *     or terminated; anything else is a hang.
 *   - LTL, checked under weak fairness (pan -a -f -N name):
 *       p_released    [] (p_held -> <> !p_held)     prefill blocks
 *       d_released    [] (d_held -> <> !d_held)     decode blocks
 *       request_ends  <> (router Completed or Failed)
 *
 * MUTATIONS: -DMUT_<name> at spin -a time (or PD_SPEC_MUT=MUT_<name> for a
 * model built with -DRUNTIME_SELECT, as scripts/check-spec.sh does):
 *   MUT_DEFER_EXPIRY         field report bug 1: the deferred write expires
 *                            (60 s vs 78 s), marks the transfer ended and
 *                            drops the late RemoteBlocks, telling nobody
 *   MUT_NO_WRITE_FAIL_MSG    a failed RMA-write post ends the prefill silently
 *   MUT_LOCAL_ID_RELEASE     the decode's Release carries its local id
 *   MUT_ONE_TO_ONE_SIBLINGS  a 1:1 transfer->sibling map: one sibling lost
 *   MUT_END_CANCELS_RETX     ending (Draining/Quarantined) stops retransmitting
 *                            RemoteBlocks / KvAddresses
 *   MUT_FREE_WITHOUT_FENCE   a dead peer's exposed blocks are made private at
 *                            once (revoke assumed instant, no fence)
 */

#ifndef MAXFAULTS
#define MAXFAULTS 2     /* network faults (loss, duplication, reordering) per run */
#endif
#ifndef MAXDISRUPT
#define MAXDISRUPT 1    /* disruptions armed per run */
#endif
#ifndef QSZ
#define QSZ 5           /* channel capacity; overflow is an assertion failure */
#endif

mtype = { StartPrefill, StartDecode, Abort, Outcome, RemoteBlocks, KvAddresses,
          WriteDone, Release, Ack, Heartbeat, NONE, Completed, Failed };
/* Heartbeat is never sent: leases are the *_dead_at_* events below. */

#define TID    7   /* transfer id minted by the router */
#define DLOCAL 3   /* the decode's local request id: must never cross the wire */

#define WRITE 1
#define READ  2

/* PrefillState (Idle: no transfer known yet; not a C++ state) */
#define PrefillIdle                 0
#define PrefillPrefilling           1
#define PrefillAwaitingAddresses    2
#define PrefillWriting              3
#define PrefillAwaitingWriteDoneAck 4
#define PrefillExposed              5
#define PrefillDraining             6
#define PrefillEnded                7
/* DecodeState (Idle: no transfer known yet; not a C++ state) */
#define DecodeIdle                  0
#define DecodeAdmitting             1
#define DecodeAwaitingWrite         2
#define DecodeAwaitingAddresses     3
#define DecodeReading               4
#define DecodeDecoding              5
#define DecodeQuarantined           6
#define DecodeEnded                 7
/* RouterState */
#define RouterQueued                0
#define RouterDispatched            1
#define RouterCompleted             2
#define RouterFailed                3

chan r2p = [QSZ] of { mtype, byte, mtype };   /* kind, transfer id, sub-kind */
chan r2d = [QSZ] of { mtype, byte, mtype };   /* sub-kind: acked kind for Ack, */
chan p2r = [QSZ] of { mtype, byte, mtype };   /* Completed/Failed for Outcome  */
chan d2r = [QSZ] of { mtype, byte, mtype };
chan p2d = [QSZ] of { mtype, byte, mtype };
chan d2p = [QSZ] of { mtype, byte, mtype };

byte mode;
byte pstate, dstate, rstate;
byte faults;

/* blocks */
bool p_held, p_exposed, p_rma;   /* prefill KV blocks; exposed to D; P's write in flight */
bool d_held, d_exposed, d_rma;   /* decode blocks; exposed to P; D's read in flight */
bool kv_landed;                  /* P's write landed in D's blocks */
/* fencing: a fence asked for by D (of P) / by P (of D), and completed */
bool d_fence_req, p_fenced_by_d, p_fence_req, d_fenced_by_p;
bool rma_fenced;                 /* an RMA failed because its target had fenced it */

/* nodes and disruptions */
bool p_alive = 1, d_alive = 1;
bool arm_abort, arm_deadline, arm_crash_p, arm_crash_d, arm_wfail;
bool client_aborted, deadline_passed, wfailed;
bool kv_in_decode;    /* the decode has the complete KV (siblings forked) */
bool p_crash_late;    /* the prefill crashed after that: not a reason to fail */

/* a request may fail only for a real reason, never because of network
 * faults, and not because the prefill died after the decode had the KV */
#define REAL_REASON (client_aborted || deadline_passed || wfailed || !d_alive || \
                     (!p_alive && !p_crash_late))
bool p_dead_at_d, p_dead_at_r, d_dead_at_p, d_dead_at_r;  /* lease expiries */

/* unacked (retransmitted) messages */
bool r_un_sp, r_un_sd, r_un_ap, r_un_ad;   /* router: StartPrefill/StartDecode/Abort */
bool p_un_out, p_un_kva, p_un_wd, p_un_rel;
bool d_un_out, d_un_rb, d_un_rel;

/* the decode's sibling map: sibling -> transfer, and |transfer -> {siblings}| */
byte sib_xfer[2];
byte live_sibs;
bool sib_stop;

/* scratch for the step being executed: every step is one atomic sequence
 * that writes these before reading them (hidden: not part of the state) */
hidden mtype k, s, rk, rs;
hidden byte id, ri, ok, fin;

/* Mutations (known-bad variants; the checks must catch every one).  Select
 * with -DMUT_<name> at spin -a time, or, for a model built with
 * -DRUNTIME_SELECT, with PD_SPEC_MUT=MUT_<name> in pan's environment. */
#define M_NONE                   0
#define M_DEFER_EXPIRY           1   /* field report bug 1 (60 s expiry vs 78 s) */
#define M_NO_WRITE_FAIL_MSG      2   /* failed write post ends silently */
#define M_LOCAL_ID_RELEASE       3   /* Release carries the decode-local id */
#define M_ONE_TO_ONE_SIBLINGS    4   /* 1:1 transfer -> sibling map */
#define M_END_CANCELS_RETX       5   /* ending cancels the address retransmission */
#define M_FREE_WITHOUT_FENCE     6   /* a dead peer's exposed blocks freed unfenced */
#if defined(MUT_DEFER_EXPIRY)
#define MUT_DEFAULT M_DEFER_EXPIRY
#elif defined(MUT_NO_WRITE_FAIL_MSG)
#define MUT_DEFAULT M_NO_WRITE_FAIL_MSG
#elif defined(MUT_LOCAL_ID_RELEASE)
#define MUT_DEFAULT M_LOCAL_ID_RELEASE
#elif defined(MUT_ONE_TO_ONE_SIBLINGS)
#define MUT_DEFAULT M_ONE_TO_ONE_SIBLINGS
#elif defined(MUT_END_CANCELS_RETX)
#define MUT_DEFAULT M_END_CANCELS_RETX
#elif defined(MUT_FREE_WITHOUT_FENCE)
#define MUT_DEFAULT M_FREE_WITHOUT_FENCE
#else
#define MUT_DEFAULT M_NONE
#endif
byte mut = MUT_DEFAULT;   /* constant during a run */
#ifndef PROBE
#define PROBE 0
#endif
byte probe = PROBE;       /* reachability probe, see the end of the file */

/* the id the decode puts in its Release: its sibling->transfer map gives TID */
#define RELID (mut == M_LOCAL_ID_RELEASE -> DLOCAL : xfer_of_local)

/* Retransmit timer of a message to the router: fires when no copy is in
 * flight (the router's Ack is modelled as clearing the sender's flag). */
#define LOSTR(fwd, kind) (!(fwd??[kind,_,_]))
/* ... between the instances: no copy and no Ack of it in flight; */
#define LOST(fwd, kind, back) (!(fwd??[kind,_,_]) && !(back??[Ack,_,kind]))
/* ... and for RemoteBlocks/KvAddresses/WriteDone also no Release in flight
 * (a tombstone answers them with Release). */
#define LOSTP(fwd, kind, back) (LOST(fwd, kind, back) && !(back??[Release,_,_]))

inline send(sch, salive, skind, sid, ssub) {
  if
  :: salive -> assert(nfull(sch)); sch!skind,sid,ssub
  :: else -> skip   /* to a crashed node: vanishes */
  fi
}

/* Receive the head of rch into k,id,s.  Network faults (MAXFAULTS in all):
 * the message is lost (k = NONE), or duplicated (a copy arrives again
 * later), or overtaken by the one behind it. */
inline recv(rch) {
  if
  :: rch?k,id,s
  :: faults < MAXFAULTS -> faults++; rch?k,id,s; k = NONE
  :: faults < MAXFAULTS -> faults++; rch?k,id,s; rch!k,id,s
  :: faults < MAXFAULTS && len(rch) > 1 -> faults++; rch?rk,ri,rs; rch?k,id,s; rch!rk,ri,rs
  fi;
  /* every message carries the shared transfer id, never a local id */
  if :: k != NONE -> assert(id == TID) :: else -> skip fi
}

/* ------------------------------------------------------------- environment */
proctype Env() {
end_env:
  do
  /* lease expiry at each observer: only after a real crash */
  :: atomic { !p_alive && !p_dead_at_d -> p_dead_at_d = 1 }
  :: atomic { !p_alive && !p_dead_at_r -> p_dead_at_r = 1 }
  :: atomic { !d_alive && !d_dead_at_p -> d_dead_at_p = 1 }
  :: atomic { !d_alive && !d_dead_at_r -> d_dead_at_r = 1 }
  /* a fence asked for completes, some time later */
  :: atomic { d_fence_req && !p_fenced_by_d -> p_fenced_by_d = 1 }
  :: atomic { p_fence_req && !d_fenced_by_p -> d_fenced_by_p = 1 }
  /* orphan RMA of a crashed node: lands unless the target fenced it */
  :: atomic { !p_alive && p_rma ->
       if
       :: !d_alive -> skip
       :: d_alive && p_fenced_by_d -> rma_fenced = 1
       :: else -> assert(d_exposed && d_held); kv_landed = 1
       fi;
       p_rma = 0 }
  :: atomic { !d_alive && d_rma ->
       if
       :: !p_alive -> skip
       :: p_alive && d_fenced_by_p -> rma_fenced = 1
       :: else -> assert(p_exposed && p_held)
       fi;
       d_rma = 0 }
  od
}

/* ------------------------------------------------------------------ router */
inline r_fail() {
  assert(REAL_REASON);   /* a request fails only for a real reason */
  rstate = RouterFailed;
  r_un_sp = 0; r_un_sd = 0;
  if :: !p_dead_at_r -> r_un_ap = 1; send(r2p, p_alive, Abort, TID, NONE) :: else -> skip fi;
  if :: !d_dead_at_r -> r_un_ad = 1; send(r2d, d_alive, Abort, TID, NONE) :: else -> skip fi
}

proctype Router() {
  do
  :: atomic {
     if
     :: rstate == RouterQueued ->   /* admitted: dispatch */
        r_un_sp = 1; r_un_sd = 1;
        send(r2p, p_alive, StartPrefill, TID, NONE);
        send(r2d, d_alive, StartDecode, TID, NONE);
        rstate = RouterDispatched
     /* the client goes away / the request's deadline passes */
     :: (arm_abort && !client_aborted) || (arm_deadline && !deadline_passed) ->
        if
        :: arm_abort && !client_aborted -> client_aborted = 1
        :: arm_deadline && !deadline_passed -> deadline_passed = 1
        fi;
        if :: rstate == RouterQueued -> rstate = RouterFailed :: else -> fin = 1 fi
     /* the decode owns the request: its death fails it (the prefill's death
      * alone does not: the decode decides whether the KV already arrived) */
     :: rstate == RouterDispatched && d_dead_at_r -> fin = 1
     :: nempty(p2r) -> recv(p2r);
        if
        :: k == Outcome -> p_un_out = 0;
           assert(s == Failed);   /* only the decode reports completion */
           fin = 1
        :: else -> skip
        fi
     :: nempty(d2r) -> recv(d2r);
        if
        :: k == Outcome && s == Completed -> d_un_out = 0;
           rstate = RouterCompleted; r_un_sp = 0; r_un_sd = 0
        :: k == Outcome && s == Failed -> d_un_out = 0; fin = 1
        :: else -> skip
        fi
     :: r_un_sp && !p_dead_at_r && LOSTR(r2p, StartPrefill) ->
        send(r2p, p_alive, StartPrefill, TID, NONE)
     :: r_un_sd && !d_dead_at_r && LOSTR(r2d, StartDecode) ->
        send(r2d, d_alive, StartDecode, TID, NONE)
     fi;
     if :: fin -> fin = 0; r_fail() :: else -> skip fi;
     if
     :: rstate == RouterCompleted || rstate == RouterFailed -> goto r_end
     :: else -> skip
     fi }
  od;
r_end:
end_r_tomb:
  do
  :: atomic {
     if
     :: nempty(p2r) -> recv(p2r); if :: k == Outcome -> p_un_out = 0 :: else -> skip fi
     :: nempty(d2r) -> recv(d2r); if :: k == Outcome -> d_un_out = 0 :: else -> skip fi
     /* the deadline still passes after the end: the instances may see it */
     :: arm_deadline && !deadline_passed -> deadline_passed = 1
     :: r_un_ap && !p_dead_at_r && LOSTR(r2p, Abort) -> send(r2p, p_alive, Abort, TID, NONE)
     :: r_un_ad && !d_dead_at_r && LOSTR(r2d, Abort) -> send(r2d, d_alive, Abort, TID, NONE)
     fi }
  od
}

/* ----------------------------------------------------------------- prefill */
inline p_free() {
  assert(p_held);      /* no double free */
  assert(!p_exposed);  /* the decode can no longer read them */
  assert(!p_rma);      /* our own write no longer reads them */
  p_held = 0
}

/* end_transfer(reason), `failed` already set: wait while the decode can reach
 * our blocks or our write is in flight, else finish now */
inline p_end() {
  if
  :: p_exposed || p_rma -> pstate = PrefillDraining;
     if
     :: mut == M_END_CANCELS_RETX -> p_un_kva = 0   /* MUTATION */
     :: else -> skip   /* keep retransmitting KvAddresses: the decode may need it */
     fi
  :: else -> fin = 1
  fi
}

/* end_transfer's final step: free, Release (unless the decode released or
 * took an acked WriteDone as our release), Outcome on failure, tombstone */
inline p_finish() {
  if :: p_held -> p_free() :: else -> skip fi;
  p_un_kva = 0; p_un_wd = 0;
  if
  :: !peer_released && !wd_acked && !d_dead_at_p ->
     p_un_rel = 1; send(p2d, d_alive, Release, TID, NONE)
  :: else -> skip
  fi;
  if :: failed -> p_un_out = 1; send(p2r, 1, Outcome, TID, Failed) :: else -> skip fi;
  pstate = PrefillEnded
}

inline post_write() {
  if
  :: arm_wfail ->            /* the RMA write cannot be posted */
     wfailed = 1;
     if
     :: mut == M_NO_WRITE_FAIL_MSG -> p_free(); pstate = PrefillEnded  /* MUTATION: silent */
     :: else -> failed = 1; fin = 1
     fi
  :: else -> p_rma = 1; pstate = PrefillWriting
  fi
}

inline crash_p() {
  p_alive = 0; p_crash_late = kv_in_decode;
  p_held = 0; p_exposed = 0;          /* memory gone; p_rma stays as an orphan */
  p_un_out = 0; p_un_kva = 0; p_un_wd = 0; p_un_rel = 0;
  do
  :: nempty(r2p) -> r2p?k,id,s
  :: nempty(d2p) -> d2p?k,id,s
  :: empty(r2p) && empty(d2p) -> break
  od
}

proctype Prefill() {
  bool have_addr, peer_released, wd_acked, failed, d_dead_seen;
  bool silent;   /* MUT_DEFER_EXPIRY only */

end_p_idle:
  do
  :: atomic {
     if
     :: nempty(r2p) -> recv(r2p);
        if
        :: k == StartPrefill -> r_un_sp = 0; p_held = 1; pstate = PrefillPrefilling
        :: k == Abort -> r_un_ap = 0; pstate = PrefillEnded  /* tombstone: a later Start is refused */
        :: else -> skip
        fi
     :: arm_crash_p && p_alive -> crash_p()
     fi;
     if
     :: !p_alive -> goto p_gone
     :: p_alive && pstate == PrefillEnded -> goto p_tomb
     :: p_alive && pstate == PrefillPrefilling -> goto p_live
     :: else -> skip
     fi }
  od;

p_live:
  do
  :: atomic {
     if
     /* the prompt's KV is computed */
     :: pstate == PrefillPrefilling ->
        if
        :: mode == WRITE && have_addr -> post_write()
        :: mode == WRITE && !have_addr -> pstate = PrefillAwaitingAddresses   /* deferred write */
        :: mode == READ ->
           p_exposed = 1; p_un_kva = 1; send(p2d, d_alive, KvAddresses, TID, NONE);
           pstate = PrefillExposed
        fi
     /* our RMA write completes */
     :: p_rma && (pstate == PrefillWriting || pstate == PrefillDraining) ->
        if
        :: !d_alive -> ok = 0                                   /* gone: error */
        :: d_alive && p_fenced_by_d -> rma_fenced = 1; ok = 0   /* fenced: error */
        :: else -> assert(d_exposed && d_held); kv_landed = 1; ok = 1  /* lands in held blocks */
        fi;
        p_rma = 0;
        if
        :: pstate == PrefillWriting && ok ->
           p_free(); p_un_wd = 1; send(p2d, d_alive, WriteDone, TID, NONE);
           pstate = PrefillAwaitingWriteDoneAck
        :: pstate == PrefillWriting && !ok -> failed = 1; fin = 1
        :: pstate == PrefillDraining -> fin = !p_exposed
        fi
     :: nempty(r2p) -> recv(r2p);
        if
        :: k == StartPrefill -> r_un_sp = 0   /* duplicate */
        :: k == Abort -> r_un_ap = 0; if :: !failed -> failed = 1; p_end() :: else -> skip fi
        :: else -> skip
        fi
     :: nempty(d2p) -> recv(d2p);
        if
        :: k == RemoteBlocks -> assert(mode == WRITE);
           send(p2d, d_alive, Ack, TID, RemoteBlocks);
           if
           :: pstate == PrefillPrefilling -> have_addr = 1
           :: pstate == PrefillAwaitingAddresses -> have_addr = 1; post_write()
           :: else -> skip   /* duplicate */
           fi
        :: k == Release ->
           send(p2d, d_alive, Ack, TID, Release);
           peer_released = 1; p_un_kva = 0; p_un_wd = 0;
           if
           :: p_exposed -> assert(!d_rma); p_exposed = 0   /* stop exposing */
           :: else -> skip
           fi;
           if
           :: pstate == PrefillExposed || pstate == PrefillAwaitingWriteDoneAck -> fin = 1
           :: pstate == PrefillWriting -> failed = 1; pstate = PrefillDraining
           :: pstate == PrefillDraining -> fin = !p_rma
           :: pstate == PrefillPrefilling || pstate == PrefillAwaitingAddresses ->
              failed = 1; fin = 1
           fi
        :: k == Ack && s == KvAddresses -> p_un_kva = 0
        :: k == Ack && s == WriteDone -> p_un_wd = 0;
           if
           :: pstate == PrefillAwaitingWriteDoneAck -> wd_acked = 1; fin = 1
           :: else -> skip
           fi
        :: else -> skip
        fi
     /* the request's deadline, at this instance */
     :: deadline_passed && !failed -> failed = 1; p_end()
     /* the decode is declared dead: fence it if it can reach our blocks;
      * free once the fence is complete and our own RMA is over */
     :: d_dead_at_p && !d_dead_seen ->
        d_dead_seen = 1; p_un_kva = 0; p_un_wd = 0;
        if
        :: p_exposed && mut == M_FREE_WITHOUT_FENCE -> p_exposed = 0   /* MUTATION */
        :: p_exposed && mut != M_FREE_WITHOUT_FENCE -> p_fence_req = 1
        :: else -> skip
        fi;
        if
        :: pstate == PrefillDraining -> fin = !p_rma && !p_exposed
        :: else -> failed = 1; p_end()
        fi
     /* the fence of the decode completed: our blocks are private again */
     :: d_fenced_by_p && p_exposed -> p_exposed = 0;
        if :: pstate == PrefillDraining -> fin = !p_rma :: else -> skip fi
     /* retransmissions */
     :: p_un_kva && !d_dead_at_p && LOSTP(p2d, KvAddresses, d2p) ->
        send(p2d, d_alive, KvAddresses, TID, NONE)
     :: p_un_wd && !d_dead_at_p && LOSTP(p2d, WriteDone, d2p) ->
        send(p2d, d_alive, WriteDone, TID, NONE)
     /* MUTATION (field report bug 1): the deferred write expires after a fixed
      * time while the decode and the request are alive, marks the transfer
      * ended and tells nobody */
     :: mut == M_DEFER_EXPIRY && pstate == PrefillAwaitingAddresses && d_alive &&
        rstate == RouterDispatched ->
        p_free(); silent = 1; pstate = PrefillEnded
     :: arm_crash_p && p_alive -> crash_p()
     fi;
     if :: fin -> fin = 0; p_finish() :: else -> skip fi;
     if
     :: !p_alive -> goto p_gone
     :: p_alive && pstate == PrefillEnded -> goto p_tomb
     :: else -> skip
     fi }
  od;

p_tomb:
end_p_tomb:
  do
  :: atomic {
     if
     :: nempty(r2p) -> recv(r2p);
        if
        :: k == StartPrefill -> r_un_sp = 0   /* refused */
        :: k == Abort -> r_un_ap = 0
        :: else -> skip
        fi
     :: nempty(d2p) -> recv(d2p);
        if
        :: k == RemoteBlocks ->
           /* ended: answer Release (not Ack: the decode keeps retransmitting
            * until one Release gets through) */
           if
           :: silent -> skip   /* MUTATION: the "already terminal" guard drops it */
           :: else -> send(p2d, d_alive, Release, TID, NONE)
           fi
        :: k == Release -> send(p2d, d_alive, Ack, TID, Release); p_un_rel = 0
        :: k == Ack && s == Release -> p_un_rel = 0
        :: else -> skip
        fi
     :: p_un_rel && !d_dead_at_p && LOST(p2d, Release, d2p) ->
        send(p2d, d_alive, Release, TID, NONE)
     :: p_un_out && LOSTR(p2r, Outcome) -> send(p2r, 1, Outcome, TID, Failed)
     :: arm_crash_p && p_alive -> crash_p()
     fi;
     if :: !p_alive -> goto p_gone :: else -> skip fi }
  od;
p_gone:
  skip
}

/* ------------------------------------------------------------------ decode */
/* A sibling decodes on the transfer's blocks, then finishes (or is ended by
 * the transfer's end: sib_stop); either way it leaves the transfer's set. */
proctype Sibling(byte i) {
  atomic {
    assert(sib_xfer[i] == TID);   /* belongs to the one transfer */
    assert(d_held || !d_alive);   /* its blocks were not freed under it */
    if
    :: mut == M_ONE_TO_ONE_SIBLINGS && i == 0 -> skip   /* MUTATION: not in the map */
    :: else -> live_sibs--
    fi
  }
}

inline fork_siblings() {
  /* token N computed once; both siblings are children of the ONE transfer */
  kv_in_decode = 1;
  sib_xfer[0] = xfer_of_local; sib_xfer[1] = xfer_of_local;
  if
  :: mut == M_ONE_TO_ONE_SIBLINGS -> live_sibs = 1   /* MUTATION: sibling 1 overwrote 0 */
  :: else -> live_sibs = 2
  fi;
  run Sibling(0); run Sibling(1);
  dstate = DecodeDecoding
}

inline d_free() {
  assert(d_held);       /* no double free */
  assert(!d_exposed);   /* the prefill can no longer write into them */
  assert(!d_rma);       /* our own read no longer writes into them */
  assert(live_sibs == 0);
  d_held = 0
}

inline d_end() {
  if
  :: dstate == DecodeDecoding -> sib_stop = 1   /* free once both siblings ended */
  :: dstate != DecodeDecoding && (d_exposed || d_rma) -> dstate = DecodeQuarantined;
     if
     :: mut == M_END_CANCELS_RETX -> d_un_rb = 0   /* MUTATION */
     :: else -> skip   /* keep retransmitting RemoteBlocks: the prefill may need it */
     fi
  :: else -> fin = 1
  fi
}

inline d_finish() {
  assert(live_sibs == 0);
  if :: d_held -> d_free() :: else -> skip fi;
  d_un_rb = 0;
  if
  :: !peer_released && !rel_sent && !p_dead_at_d ->
     rel_sent = 1; d_un_rel = 1; send(d2p, p_alive, Release, RELID, NONE)
  :: else -> skip
  fi;
  d_un_out = 1;
  if :: failed -> s = Failed :: else -> s = Completed fi;
  send(d2r, 1, Outcome, xfer_of_local, s);
  dstate = DecodeEnded
}

inline start_read() { d_rma = 1; dstate = DecodeReading }

inline crash_d() {
  d_alive = 0;
  d_held = 0; d_exposed = 0;         /* memory gone; d_rma stays as an orphan */
  sib_stop = 1;
  d_un_out = 0; d_un_rb = 0; d_un_rel = 0;
  do
  :: nempty(r2d) -> r2d?k,id,s
  :: nempty(p2d) -> p2d?k,id,s
  :: empty(r2d) && empty(p2d) -> break
  od
}

proctype Decode() {
  byte xfer_of_local;   /* the sibling->transfer map, for this decode's local id DLOCAL */
  bool have_kva, peer_released, rel_sent, failed, p_dead_seen;

end_d_idle:
  do
  :: atomic {
     if
     :: nempty(r2d) -> recv(r2d);
        if
        :: k == StartDecode -> r_un_sd = 0; xfer_of_local = id; dstate = DecodeAdmitting
        :: k == Abort -> r_un_ad = 0; xfer_of_local = id; dstate = DecodeEnded
        :: else -> skip
        fi
     :: arm_crash_d && d_alive -> crash_d()
     fi;
     if
     :: !d_alive -> goto d_gone
     :: d_alive && dstate == DecodeEnded -> goto d_tomb
     :: d_alive && dstate == DecodeAdmitting -> goto d_live
     :: else -> skip
     fi }
  od;

d_live:
  do
  :: atomic {
     if
     /* admitted: blocks allocated (may take long: 78 s in the report) */
     :: dstate == DecodeAdmitting ->
        d_held = 1;
        if
        :: mode == WRITE ->
           d_exposed = 1; d_un_rb = 1;
           send(d2p, p_alive, RemoteBlocks, xfer_of_local, NONE);
           dstate = DecodeAwaitingWrite
        :: mode == READ && have_kva -> start_read()
        :: mode == READ && !have_kva -> dstate = DecodeAwaitingAddresses
        fi
     /* our RMA read completes */
     :: d_rma && (dstate == DecodeReading || dstate == DecodeQuarantined) ->
        if
        :: !p_alive -> ok = 0                                   /* gone: error */
        :: p_alive && d_fenced_by_p -> rma_fenced = 1; ok = 0   /* fenced: error */
        :: else -> assert(p_exposed && p_held); ok = 1          /* reads held prefill blocks */
        fi;
        d_rma = 0;
        if
        :: dstate == DecodeReading && ok ->
           rel_sent = 1; d_un_rel = 1; send(d2p, p_alive, Release, RELID, NONE);
           fork_siblings()
        :: dstate == DecodeReading && !ok -> failed = 1; fin = 1
        :: dstate == DecodeQuarantined -> fin = !d_exposed
        fi
     /* both siblings are done */
     :: dstate == DecodeDecoding && live_sibs == 0 -> fin = 1
     :: nempty(r2d) -> recv(r2d);
        if
        :: k == StartDecode -> r_un_sd = 0   /* duplicate */
        :: k == Abort -> r_un_ad = 0; if :: !failed -> failed = 1; d_end() :: else -> skip fi
        :: else -> skip
        fi
     :: nempty(p2d) -> recv(p2d);
        if
        :: k == KvAddresses -> assert(mode == READ);
           send(d2p, p_alive, Ack, TID, KvAddresses);
           if
           :: dstate == DecodeAdmitting -> have_kva = 1
           :: dstate == DecodeAwaitingAddresses -> have_kva = 1; start_read()
           :: else -> skip
           fi
        :: k == WriteDone -> assert(mode == WRITE);
           send(d2p, p_alive, Ack, TID, WriteDone);
           peer_released = 1; d_un_rb = 0;
           if :: d_exposed -> assert(!p_rma); d_exposed = 0 :: else -> skip fi;
           if
           :: dstate == DecodeAwaitingWrite -> assert(kv_landed); fork_siblings()
           :: dstate == DecodeQuarantined -> fin = !d_rma
           :: else -> skip
           fi
        :: k == Release ->
           send(d2p, p_alive, Ack, TID, Release);
           peer_released = 1; d_un_rb = 0; d_un_rel = 0;
           if :: d_exposed -> assert(!p_rma); d_exposed = 0 :: else -> skip fi;
           if
           :: dstate == DecodeAdmitting || dstate == DecodeAwaitingWrite ||
              dstate == DecodeAwaitingAddresses -> failed = 1; fin = 1
           :: dstate == DecodeReading -> failed = 1; dstate = DecodeQuarantined
           :: dstate == DecodeQuarantined -> fin = !d_rma
           :: else -> skip   /* decoding: the KV is already here */
           fi
        :: k == Ack && s == RemoteBlocks -> d_un_rb = 0
        :: k == Ack && s == Release -> d_un_rel = 0
        :: else -> skip
        fi
     :: deadline_passed && !failed -> failed = 1; d_end()
     /* the prefill is declared dead: fence it if it can reach our blocks */
     :: p_dead_at_d && !p_dead_seen ->
        p_dead_seen = 1; d_un_rb = 0; d_un_rel = 0;
        if
        :: d_exposed && mut == M_FREE_WITHOUT_FENCE -> d_exposed = 0   /* MUTATION */
        :: d_exposed && mut != M_FREE_WITHOUT_FENCE -> d_fence_req = 1
        :: else -> skip
        fi;
        if
        :: dstate == DecodeDecoding -> skip   /* the KV is already here: keep decoding */
        :: dstate == DecodeQuarantined -> fin = !d_rma && !d_exposed
        :: else -> failed = 1; d_end()
        fi
     /* the fence of the prefill completed: our blocks are private again */
     :: p_fenced_by_d && d_exposed -> d_exposed = 0;
        if :: dstate == DecodeQuarantined -> fin = !d_rma :: else -> skip fi
     :: d_un_rb && !p_dead_at_d && LOSTP(d2p, RemoteBlocks, p2d) ->
        send(d2p, p_alive, RemoteBlocks, xfer_of_local, NONE)
     :: d_un_rel && !p_dead_at_d && LOST(d2p, Release, p2d) ->
        send(d2p, p_alive, Release, RELID, NONE)
     :: arm_crash_d && d_alive -> crash_d()
     fi;
     if :: fin -> fin = 0; d_finish() :: else -> skip fi;
     if
     :: !d_alive -> goto d_gone
     :: d_alive && dstate == DecodeEnded -> goto d_tomb
     :: else -> skip
     fi }
  od;

d_tomb:
end_d_tomb:
  do
  :: atomic {
     if
     :: nempty(r2d) -> recv(r2d);
        if
        :: k == StartDecode -> r_un_sd = 0   /* refused */
        :: k == Abort -> r_un_ad = 0
        :: else -> skip
        fi
     :: nempty(p2d) -> recv(p2d);
        if
        :: k == KvAddresses || k == WriteDone ->
           send(d2p, p_alive, Release, RELID, NONE)   /* ended: answer Release */
        :: k == Release -> send(d2p, p_alive, Ack, TID, Release); d_un_rel = 0
        :: k == Ack && s == Release -> d_un_rel = 0
        :: else -> skip
        fi
     :: d_un_rel && !p_dead_at_d && LOST(d2p, Release, p2d) ->
        send(d2p, p_alive, Release, RELID, NONE)
     :: d_un_out && LOSTR(d2r, Outcome) ->
        if :: failed -> s = Failed :: else -> s = Completed fi;
        send(d2r, 1, Outcome, xfer_of_local, s)
     :: arm_crash_d && d_alive -> crash_d()
     fi;
     if :: !d_alive -> goto d_gone :: else -> skip fi }
  od;
d_gone:
  skip
}

/* -------------------------------------------------------------------- init */
#ifdef RUNTIME_SELECT
/* scripts/check-spec.sh builds pan once and picks the mode and the mutation
 * per run: PD_SPEC_MODE=WRITE|READ, PD_SPEC_MUT=MUT_<name> (unset: none) */
c_code {
  static int pd_spec_env(const char *var, const char *const *names, int n, int dflt) {
    const char *v = getenv(var);
    int i;
    if (!v || !*v) return dflt;
    for (i = 0; i < n; i++) if (names[i] && strcmp(v, names[i]) == 0) return i;
    fprintf(stderr, "pd_transfer: bad %s=%s\n", var, v);
    exit(2);
  }
  static const char *const pd_spec_modes[] = { 0, "WRITE", "READ" };
  static const char *const pd_spec_muts[] = { "", "MUT_DEFER_EXPIRY",
    "MUT_NO_WRITE_FAIL_MSG", "MUT_LOCAL_ID_RELEASE", "MUT_ONE_TO_ONE_SIBLINGS",
    "MUT_END_CANCELS_RETX", "MUT_FREE_WITHOUT_FENCE" };
}
#endif

init {
  byte n;
  atomic {
#ifdef RUNTIME_SELECT
    c_code {
      now.mode = pd_spec_env("PD_SPEC_MODE", pd_spec_modes, 3, 0);
      now.mut = pd_spec_env("PD_SPEC_MUT", pd_spec_muts, 7, now.mut);
      { const char *v = getenv("PD_SPEC_PROBE"); if (v && *v) now.probe = atoi(v); }
    };
#endif
#if defined(MODE_WRITE)
    mode = WRITE;
#elif defined(MODE_READ)
    mode = READ;
#else
    if :: mode == 0 -> if :: mode = WRITE :: mode = READ fi :: else -> skip fi;
#endif
    /* arm any subset of at most MAXDISRUPT disruptions */
    if :: n < MAXDISRUPT -> arm_abort = 1; n++    :: skip fi;
    if :: n < MAXDISRUPT -> arm_deadline = 1; n++ :: skip fi;
    if :: n < MAXDISRUPT -> arm_crash_p = 1; n++  :: skip fi;
    if :: n < MAXDISRUPT -> arm_crash_d = 1; n++  :: skip fi;
    if :: n < MAXDISRUPT && mode == WRITE -> arm_wfail = 1; n++ :: skip fi;
    run Router(); run Prefill(); run Decode(); run Env()
  }
}

/* Reachability probes (non-vacuity): with probe = N (-DPROBE=N at spin -a
 * time, or PD_SPEC_PROBE=N with -DRUNTIME_SELECT) Spin reports an assertion
 * violation iff a state satisfying probe N is reachable.  The check script
 * requires each to be reached, so that the passing runs above are not
 * passing because some path of the protocol is dead. */
#if defined(PROBE) || defined(RUNTIME_SELECT)
#define PROBE_HIT ( \
  (probe == 1 && rstate == RouterCompleted && faults == MAXFAULTS) || \
  (probe == 2 && rstate == RouterCompleted && dstate == DecodeEnded && \
                 pstate == PrefillEnded && !p_held && !d_held) || \
  (probe == 3 && pstate == PrefillDraining && dstate == DecodeQuarantined) || \
  (probe == 4 && dstate == DecodeDecoding && sib_stop && live_sibs == 2) || \
  (probe == 5 && d_dead_at_p && pstate == PrefillDraining) || \
  (probe == 6 && p_dead_at_d && !d_held && dstate == DecodeEnded && rstate == RouterFailed) || \
  (probe == 7 && pstate == PrefillEnded && dstate == DecodeAdmitting) || \
  (probe == 8 && mode == WRITE && kv_landed && dstate == DecodeQuarantined) || \
  (probe == 9 && mode == READ && d_rma && !p_exposed) || \
  (probe == 10 && mode == WRITE && kv_landed && d_fence_req && !p_fenced_by_d) || \
  (probe == 11 && mode == WRITE && rma_fenced) )
active proctype Probe() {
end_probe:
  if :: PROBE_HIT -> assert(false) fi
}
#endif

/* ------------------------------------------------------------------ LTL */
ltl p_released    { [] (p_held -> <> !p_held) }
ltl d_released    { [] (d_held -> <> !d_held) }
ltl request_ends  { <> (rstate == RouterCompleted || rstate == RouterFailed) }
