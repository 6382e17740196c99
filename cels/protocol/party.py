"""The party role P_k (CELS section 4.2; docs/protocol.md phases 1-5).

One state machine per session over this party's private log D_k.  Phases, in order:

1. ``universe``: commutative hashing of the pair ids around the ring (X25519 by default,
   Pohlig-Hellman as an option); P_1 assembles the sorted union of the fully hashed ids.
2. ``counts``: secure sums (Algorithm 1, P_1's key) of the capped count vectors, then of the
   indicator "one of my users holds all of pair i" (unique pairs); every party then applies
   the same suppression and cleaning (min_count) to the public totals c.
3. ``nlp``: local ln t rows, dominated rows pruned, eqs. 7-8 (transform.py); the one-
   encryption ring under P_0's key; per-party column permutation with re-randomisation; the
   solution un-permuted in reverse order; every party checks its exact rows on x.
4. ``sampling``: the exact staged Poisson protocol (sums "sampling-<stage>") or the paper's
   local sampling.
5. ``union``: the secure union of the sampled records (user pseudonym, query, url, count);
   the initiator keeps the output log and the session report.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import Executor

import numpy as np
import scipy.sparse as sp

from cels.crypto import paillier
from cels.crypto.commutative_cipher import CommutativeCipherError, PohligHellmanHash
from cels.crypto.ec_hash import X25519Hash
from cels.crypto.groups import group_for_bits
from cels.crypto.obfuscators import InlineObfuscators, ObfuscatorSource
from cels.crypto.streams import CipherRandom
from cels import metrics
from cels.claims import privacy_accounting
from cels.logs.model import MAX_COUNT, LogRecord, SearchLog
from cels.mechanism.conditions import apply_cap, log_t_rows, prune_dominated
from cels.protocol.aborts import PROTOCOL_ERROR
from cels.protocol.options import SessionOptions
from cels.protocol.phases import Phase, solve_phase
from cels.protocol.roles import Outgoing, accepts, fail, malformed
from cels.protocol.rolebase import RoleFailure, SessionRole
from cels.mechanism.sampling import make_rng, multinomial_sample, pseudonyms
from cels.protocol.masked_sum import MaskedSum
from cels.protocol.secure_sum import SecureSum
from cels.protocol.secure_union import SecureUnion
from cels.mechanism.greedy import ProposalRule
from cels.mechanism.noise import noise_scale
from cels.protocol.private_solve import PrivateSolveParty
from cels.protocol.sampling import StagedSampler, paper_trials
from cels.protocol.transform import agreed_ell, share_packings, transform_constraints
from cels.protocol.wire import cels_pb2, codec

COUNT_BOUND = MAX_COUNT
"""Public packing bound of every party's count and stage-total vectors (secure sums): the
largest pair total a log may hold (docs/formats.md, "Limits")."""


MAX_SOLUTION_COUNT = 2**53
"""The largest count x_i a solution may give: exact in int64 and in the float64 check of the
conditions (far above any b c_i of a log within docs/formats.md's limits)."""


_ITEM_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode  # made once, not per item


def encode_item(*fields) -> bytes:
    """Injective byte encoding of a pair id (query, url) or an output record."""
    return _ITEM_JSON(list(fields)).encode()


def union_record(data: bytes) -> LogRecord:
    """Inverse of encode_item for a record (user, query, url, count)."""
    try:
        user, query, url, count = json.loads(data.decode())
        if not (isinstance(user, str) and isinstance(query, str) and isinstance(url, str) and isinstance(count, int)):
            raise ValueError("field types")
    except (ValueError, UnicodeDecodeError) as exc:
        raise malformed(f"union record does not decode: {exc}") from None
    if count < 1:
        raise malformed(f"union record with count {count}")
    return LogRecord(user, query, url, count)


def commutative_hash(options: SessionOptions, allow_paper_bits: bool = False) -> X25519Hash | PohligHellmanHash:
    """This party's fresh key for the universe phase (docs/protocol.md: EC by default, PH as an option)."""
    if options.universe_cipher == "x25519":
        return X25519Hash()
    return PohligHellmanHash(group_for_bits(options.group_bits, allow_paper_bits=allow_paper_bits))


def session_privacy(options: SessionOptions, b: float) -> dict:
    """The session's privacy accounting (cels.claims): the solve mode is the threat-model row."""
    return privacy_accounting(
        epsilon=options.epsilon, delta=options.delta, b=b, bound=options.bound, noise_epsilon=options.noise_epsilon,
        sensitivity=options.sensitivity, cap=options.cap, setting=options.solve, seeded=False,
    )


class PartyRole(SessionRole):
    """P_k for one session.  ``log`` is the private log or a callable that loads it (a load
    failure aborts the session with the loader's message).  ``obfuscators`` maps a public key
    N to its obfuscator source (a node's stock, cels.node.keys); ``keypair`` is the node key
    this party uses when it is P_1 (default: a fresh pair for the session); ``decryption_pool``
    (a thread or process pool) spreads P_1's CRT decryptions of the secure sums over cores."""

    def __init__(
        self,
        name: str,
        options: SessionOptions,
        log: SearchLog | Callable[[], SearchLog],
        *,
        allow_insecure_key_bits: bool = False,
        obfuscators: Callable[[int], ObfuscatorSource] = InlineObfuscators,
        keypair: tuple[paillier.PublicKey, paillier.PrivateKey] | None = None,
        decryption_pool: Executor | None = None,
    ) -> None:
        super().__init__(name, options)
        if name not in self.parties:
            raise ValueError(f"{name!r} is not a party of session {self.session_id!r}")
        self.k = self.parties.index(name)
        self.r = len(self.parties)
        self.successor = self.parties[(self.k + 1) % self.r]
        self.predecessor = self.parties[self.k - 1]
        self.key_holder = self.parties[0]  # P_1: Algorithm 1's key, assembles the universe
        self._log_source = log
        self._allow_insecure = allow_insecure_key_bits
        self._obfuscators = obfuscators
        self._decryption_pool = decryption_pool
        self._hash = commutative_hash(options, allow_paper_bits=allow_insecure_key_bits)
        # this party's ChaCha20 stream (docs/crypto.md, Randomness): A_k, F_k, pi_k, Poisson and
        # multinomial draws, pseudonyms, the union's shuffles and (as CipherRandom) the noise shares
        self._rng = make_rng()
        self.log: SearchLog | None = None
        self.reports: list[cels_pb2.StepReport] = []
        self._sums: dict[str, SecureSum | MaskedSum] = {}
        self._sums_begun = 0  # masked sums so far: each one's mask round number
        self.nlp_key: paillier.PublicKey | None = None
        self._summed = False  # this party's share is in the NLP sum
        self._sampler: StagedSampler | None = None
        self.pi: np.ndarray | None = None  # pi_k, this party's column permutation (Algorithm 2 line 11)
        self._obfuscator_sources: dict[int, ObfuscatorSource] = {}
        # P_1's key for every secure sum of the session: the node key if given, else fresh
        self._sum_keypair = paillier.checked_keypair(keypair, options.key_bits)
        scale = noise_scale(options.noise_epsilon, options.sensitivity) if options.noise_epsilon is not None else None
        self._private = (
            PrivateSolveParty(
                name, self.parties, self.solver, self.session_id, noise_scale=scale, rng=CipherRandom(generator=self._rng)
            )
            if options.solve == "private"
            else None
        )

    def view_keys(self) -> list:
        return [] if self._sum_keypair is None else [self._sum_keypair[1]]

    # -- phase 1: universe -------------------------------------------------------------------
    def _begin(self) -> list[Outgoing]:
        self._enter(Phase.LOAD)
        try:
            log = self._log_source() if callable(self._log_source) else self._log_source
        except Exception as exc:  # noqa: BLE001 - any load failure aborts the session (its message stays here)
            raise RoleFailure("cannot load its log", f"cannot load the log: {exc}") from None
        self.log = log
        self.counts = apply_cap(log.counts, self.options.cap).tocsr()
        local_totals = np.asarray(self.counts.sum(axis=0)).ravel()
        own = np.flatnonzero(local_totals > 0)
        self._enter(Phase.UNIVERSE)
        pairs = log.pairs
        first = self._hash.hash([encode_item(*pairs[i]) for i in own])
        order = sorted(range(len(own)), key=first.__getitem__)  # ids leave sorted, not in log order
        self._own_pairs = own[order]
        self._full_ids: list[bytes] | None = None
        self._universe_sets: dict[str, list[bytes]] = {}
        self._ids_seen = len(own)  # every party's set passes this party: the union has at most this many
        hop = cels_pb2.UniverseHop(
            session_id=self.session_id, owner=self.name, applied=[self.name], ids=[first[t] for t in order]
        )
        masks = self._private.mask_keys() if self._private is not None else []  # for the masked sums from phase 2 on
        return masks + self._send(self.successor, universe_hop=hop)

    def _on_universe_hop(self, sender: str, msg: cels_pb2.UniverseHop) -> list[Outgoing]:
        applied = list(msg.applied)
        if msg.owner not in self.parties or not applied or applied[0] != msg.owner or len(set(applied)) != len(applied):
            raise malformed(f"{self.name}: universe_hop owner/applied inconsistent")
        if len(applied) < self.r:  # forward with this party's layer
            self._expect_sender(sender, self.predecessor, "universe_hop")
            if self.name in applied or applied != [self.parties[(self.parties.index(msg.owner) + t) % self.r] for t in range(len(applied))]:
                raise fail(f"{self.name}: universe_hop of {msg.owner} arrived out of ring order")
            self._ids_seen += len(msg.ids)
            try:
                ids = self._hash.apply(list(msg.ids))
            except CommutativeCipherError as exc:
                raise malformed(f"{self.name}: universe_hop: {exc}") from None
            hop = cels_pb2.UniverseHop(session_id=self.session_id, owner=msg.owner, applied=[*applied, self.name], ids=ids)
            return self._send(self.successor, universe_hop=hop)
        if msg.owner == self.name:  # my own ids, every layer applied, in the order I sent them
            self._expect_sender(sender, self.predecessor, "universe_hop")
            if self._full_ids is not None or len(msg.ids) != len(self._own_pairs):
                raise fail(f"{self.name}: unexpected return of its own universe ids")
            self._full_ids = list(msg.ids)
            if self.name != self.key_holder:
                hop = cels_pb2.UniverseHop(
                    session_id=self.session_id, owner=self.name, applied=applied, ids=sorted(self._full_ids)
                )
                return self._send(self.key_holder, universe_hop=hop)
            return self._collect_universe(self.name, self._full_ids)
        if self.name != self.key_holder or sender != msg.owner:
            raise fail(f"{self.name}: complete universe ids of {msg.owner} from {sender}")
        ids = list(msg.ids)
        if any(a >= b for a, b in zip(ids, ids[1:])):
            raise malformed(f"{self.name}: complete universe ids of {msg.owner} are not sorted and distinct")
        return self._collect_universe(msg.owner, ids)

    def _collect_universe(self, owner: str, ids: list[bytes]) -> list[Outgoing]:
        """P_1 assembles the sorted union of the fully hashed ids (the index of variables) and
        tells every party its size and the columns of that party's own ids (docs/protocol.md)."""
        if owner in self._universe_sets:
            raise fail(f"{self.name}: second complete universe set of {owner}")
        self._universe_sets[owner] = ids
        if len(self._universe_sets) < self.r:
            return []
        index = sorted(set().union(*self._universe_sets.values()))
        position = {pid: i for i, pid in enumerate(index)}
        out = []
        for party in self.parties:
            if party != self.name:
                columns = [position[f] for f in self._universe_sets[party]]
                out += self._send(party, universe_index=cels_pb2.UniverseIndex(session_id=self.session_id, size=len(index), columns=columns))
        self._universe_sets = {}
        own = np.array([position[f] for f in self._full_ids], dtype=np.int64)
        return out + self._apply_index(len(index), own)

    def _on_universe_index(self, sender: str, msg: cels_pb2.UniverseIndex) -> list[Outgoing]:
        """The index size and the columns of this party's ids, in the sorted order it sent them."""
        self._expect_sender(sender, self.key_holder, "universe_index")
        if self._full_ids is None:
            raise fail(f"{self.name}: universe_index before its own ids came back")
        by_id = np.asarray(msg.columns, dtype=np.int64)
        if msg.size > self._ids_seen:
            raise malformed(f"{self.name}: universe_index of {msg.size} pairs, more than the {self._ids_seen} ids of all parties")
        if len(by_id) != len(self._full_ids) or np.any(np.diff(by_id) <= 0) or (len(by_id) and by_id[-1] >= msg.size):
            raise malformed(
                f"{self.name}: universe_index: {len(by_id)} columns for {len(self._full_ids)} ids, "
                f"not strictly increasing below the index size {msg.size}"
            )
        cols = np.empty_like(by_id)
        cols[sorted(range(len(self._full_ids)), key=self._full_ids.__getitem__)] = by_id
        return self._apply_index(int(msg.size), cols)

    def _apply_index(self, n: int, cols: np.ndarray) -> list[Outgoing]:
        """Own pair t is index column ``cols[t]`` of ``n``; start the secure counts sum (Algorithm 1)."""
        self.n = n
        select = sp.csr_matrix(
            (np.ones(len(cols), dtype=np.int64), (np.arange(len(cols)), cols)), shape=(len(cols), self.n)
        )
        self.local = (self.counts[:, self._own_pairs] @ select).tocsr()  # users x universe
        self.pair_of = dict(zip(cols.tolist(), self._own_pairs.tolist()))  # column -> own pair index
        self._enter(Phase.COUNTS)
        vector = np.asarray(self.local.sum(axis=0)).ravel().astype(np.int64)
        return self._start_sum("counts", vector)

    # -- secure sums (Algorithm 1) -------------------------------------------------------------
    def _obfuscators_for(self, key: paillier.PublicKey) -> ObfuscatorSource:
        """One obfuscator source per public key for the whole session (a pool is made once)."""
        n = int(key.n)
        if n not in self._obfuscator_sources:
            self._obfuscator_sources[n] = self._obfuscators(n)
        return self._obfuscator_sources[n]

    def _start_sum(self, sum_id: str, vector: np.ndarray) -> list[Outgoing]:
        """Join secure sum ``sum_id``: by pairwise masks in the private mode (once every mask
        key is in), else Algorithm 1 (P_1's key, one key pair for the whole session)."""
        common = {"name": self.name, "session_id": self.session_id, "sum_id": sum_id, "ring": self.parties, "values": vector,
                  "bound": 1 if sum_id == "unique" else COUNT_BOUND}  # fmt: skip
        if self._private is None and self.k == 0 and self._sum_keypair is None:
            self._sum_keypair = paillier.generate_keypair(self.options.key_bits, allow_insecure_key_bits=self._allow_insecure)
        try:
            if self._private is not None:
                joined = MaskedSum(**common, masks=self._private.masks, round_number=self._sums_begun)
            else:
                joined = SecureSum(
                    **common, key_bits=self.options.key_bits, allow_insecure_key_bits=self._allow_insecure,
                    keypair=self._sum_keypair, obfuscators=self._obfuscators_for, nonnegative=True,
                    decryption_pool=self._decryption_pool,
                )  # fmt: skip
        except paillier.PackingOverflowError as exc:
            raise RoleFailure("a value exceeds its packing bound", str(exc)) from None
        self._sums[sum_id] = joined
        if isinstance(joined, SecureSum):
            return joined.start()
        self._sums_begun += 1
        return self._start_masked_sums()

    def _start_masked_sums(self) -> list[Outgoing]:
        """Start every masked sum not yet started, once this party has every mask key."""
        out: list[Outgoing] = []
        if not self._private.masks.complete:
            return out
        for sum_id, masked in list(self._sums.items()):
            if not masked.started and not masked.done:
                out += self._after_sum(sum_id, masked, masked.start())
        return out

    def _on_sum_message(self, sender: str, envelope) -> list[Outgoing]:
        """Secure sum messages go to the running sum of their id."""
        sum_id = getattr(envelope, envelope.WhichOneof("step")).sum_id
        secure_sum = self._sums.get(sum_id)
        if secure_sum is None:
            raise fail(f"{self.name}: message for secure sum {sum_id!r}, which is not running (phase {self.phase!r})")
        return self._after_sum(sum_id, secure_sum, secure_sum.receive(sender, envelope))

    def _after_sum(self, sum_id: str, secure_sum: SecureSum | MaskedSum, out: list[Outgoing]) -> list[Outgoing]:
        """A finished sum's result moves the session on."""
        if secure_sum.done and self._sums.get(sum_id) is secure_sum:
            del self._sums[sum_id]
            out = out + self._on_sum_done(sum_id, np.asarray(secure_sum.result).ravel())
        return out

    def _on_sum_done(self, sum_id: str, total: np.ndarray) -> list[Outgoing]:
        if sum_id == "counts":
            self.totals = total
            col_max = np.asarray(self.local.max(axis=0).todense()).ravel() if self.local.shape[0] else np.zeros(self.n)
            held_whole = ((col_max >= total) & (total > 0)).astype(np.int64)
            return self._start_sum("unique", held_whole)
        if sum_id == "unique":
            return self._constraints(total > 0)
        return self._sampling_stage_done(total)

    # -- phase 3: secure NLP (Algorithm 2) ------------------------------------------------------
    def _constraints(self, unique: np.ndarray) -> list[Outgoing]:
        """Suppress unique pairs, clean (min_count), build and prune this party's ln t rows."""
        c = self.totals
        self.active = np.flatnonzero((c > 0) & ~unique & (c >= self.options.min_count))
        self.unique_pairs = int(np.count_nonzero(unique))
        self.rows = prune_dominated(log_t_rows(self.local[:, self.active], c[self.active]))
        if self._private is not None:
            self._enter(Phase.SOLVE)
            size = round(self.options.output_size) if self.options.output_size is not None else None
            frequent = c[self.active] / c.sum() >= self.options.support if self.options.objective == "frequent" else None
            rule = ProposalRule(self.options.objective, c[self.active], self.options.round_batch, size, frequent)
            return self._private_progress(self._private.start(rule, self.rows, self.b))
        self._enter(Phase.NLP)
        shape = cels_pb2.ConstraintShape(session_id=self.session_id, party=self.name, rows=self.rows.shape[0])
        return self._send(self.solver, constraint_shape=shape)

    # -- phase 3, private solve (docs/protocol.md) ------------------------------------------------
    def _on_mask_key(self, sender: str, msg: cels_pb2.MaskKey) -> list[Outgoing]:
        if self._private is None:
            raise fail(f"{self.name}: mask_key in a session that solves with {self.options.solve!r}")
        return self._private_progress(self._private.on_mask_key(sender, msg)) + self._start_masked_sums()

    def _on_round_verdict(self, sender: str, msg: cels_pb2.RoundVerdict) -> list[Outgoing]:
        return self._private_progress(self._private.on_round_verdict(sender, msg))

    def _on_noise_total(self, sender: str, msg: cels_pb2.NoiseTotal) -> list[Outgoing]:
        return self._private_progress(self._private.on_noise_total(sender, msg))

    def _on_transcript_digest(self, sender: str, msg: cels_pb2.TranscriptDigest) -> list[Outgoing]:
        self._private.on_transcript_digest(sender, msg)
        return self._private_progress([])

    def _private_progress(self, out: list[Outgoing]) -> list[Outgoing]:
        """Once the rounds ended (no proposal left) and every party's verdict transcript agrees
        (private_solve step 6), x is public: check it and sample.  Transcripts that differ
        abort the session blaming the aggregator, with a reason that names no party."""
        if not self._private.done or self.phase != Phase.SOLVE:
            return out
        out = out + self._private.send_digest()
        agreed = self._private.agreement()
        if agreed is None:
            return out
        if not agreed:
            raise RoleFailure("verdict transcripts differ", self._private.disagreement(), PROTOCOL_ERROR, origin=self.solver)
        report = {
            "solve": "private",
            "objective": self.options.objective,
            "round_batch": self.options.round_batch,
            "rounds": self._private.round,
            "integer_total": int(self._private.x.sum()),
            "output_size": self.options.output_size,
        }
        if self._private.noise_total is not None:  # CELS App. C, from shares no node chose or saw
            z, first = self._private.noise_total, self._private.first_x
            report["noise"] = {
                "noise_epsilon": self.options.noise_epsilon,
                "sensitivity": self.options.sensitivity,
                "scale": float(self._private.noise_scale),
                "how": "sum of every party's Polya share through the masked aggregation (distributed discrete Laplace)",
                "noise_l1": int(np.abs(z).sum()),
                "total_before": int(first.sum()),
                "total_noisy": int(np.maximum(first + z, 0).sum()),
                "total_after_repair": int(self._private.x.sum()),
            }
        return out + self._solution(self._private.x.copy(), report)

    # -- phase 3, transformed solve (Algorithm 2) ------------------------------------------------
    def _on_nlp_key(self, sender: str, msg: cels_pb2.NlpKey) -> list[Outgoing]:
        self._expect_sender(sender, self.solver, "nlp_key")
        if self.nlp_key is not None:
            raise fail(f"{self.name}: second nlp_key")
        try:
            key = codec.public_key_of(msg.key, allow_insecure_key_bits=self._allow_insecure)
        except ValueError as exc:
            raise malformed(f"{self.name}: nlp_key: {exc}") from None
        rows = list(msg.shape_rows)
        if len(rows) != self.r or rows[self.k] != self.rows.shape[0] or msg.ell != agreed_ell(sum(rows), self.options.ell_ratio):
            raise self.refuse_and_abort(f"{self.name}: nlp_key shapes {rows} / l = {msg.ell} do not fit this party")
        if sum(rows) > self.totals[self.active].sum():  # every row is a user holding one of these records at least
            raise self.refuse_and_abort(
                f"{self.name}: nlp_key claims {sum(rows)} constraint rows, more than the {int(self.totals[self.active].sum())} "
                "records of the pairs they constrain"
            )
        self.nlp_key, self.ell, self.shape_rows = key, msg.ell, rows
        share = transform_constraints(self.rows, self.b, self.ell, self._rng)
        count_row = self.totals[self.active] if self.k == 0 else np.zeros(len(self.active))
        self._share = {"at": np.vstack([share.at, count_row[None, :]]), "ab": share.ab}
        self._packings = share_packings(key, int(self.totals.max(initial=1)), self.b, rows, self.r)
        self._obf = self._obfuscators_for(key)
        out = []
        if rows[self.k]:
            af = paillier.encrypt(key, share.af, self._packings["af"], self._obf)
            block = cels_pb2.NlpSlackBlock(session_id=self.session_id, party=self.name, af=codec.matrix_message(af))
            out = self._send(self.solver, nlp_slack_block=block)
        if self.k != 0:
            return out
        enc = {w: paillier.encrypt(key, self._share[w], self._packings[w], self._obf) for w in ("at", "ab")}
        return out + self._forward_sum(enc, hops=1)

    def _parse_matrices(self, msg, step: str, terms: int, which=("at", "ab")) -> dict[str, paillier.EncryptedMatrix]:
        """The encrypted matrices of a hop, checked against the session's shapes and packings."""
        shapes = {"at": (self.ell + 1, len(self.active)), "ab": (self.ell, 1)}
        out = {}
        for w in which:
            shape = shapes[w]
            try:
                enc = codec.matrix_of(getattr(msg, w), self.nlp_key, self._packings[w])
            except ValueError as exc:
                raise malformed(f"{self.name}: {step}.{w}: {exc}") from None
            if (enc.rows, enc.cols) != shape or enc.terms != terms:
                raise malformed(
                    f"{self.name}: {step}.{w} is {enc.rows}x{enc.cols} with {enc.terms} shares, "
                    f"expected {shape[0]}x{shape[1]} with {terms}"
                )
            out[w] = enc
        return out

    def _forward_sum(self, enc: dict, hops: int) -> list[Outgoing]:
        """Next sum hop; after the last share AB goes to P_0 and AT into the permutation ring."""
        protos = {w: codec.matrix_message(e) for w, e in enc.items()}
        if hops < self.r:
            hop = cels_pb2.NlpSumHop(session_id=self.session_id, hops=hops, **protos)
            return self._send(self.successor, nlp_sum_hop=hop)
        slacks = cels_pb2.NlpSumHop(session_id=self.session_id, hops=hops, ab=protos["ab"])
        ring = cels_pb2.NlpPermuteHop(session_id=self.session_id, hops=0, at=protos["at"])
        return self._send(self.solver, nlp_sum_hop=slacks) + self._send(self.parties[0], nlp_permute_hop=ring)

    def _on_nlp_sum_hop(self, sender: str, msg: cels_pb2.NlpSumHop) -> list[Outgoing]:
        """Algorithm 2 line 8: add this party's plaintext share, re-randomise, forward."""
        self._expect_sender(sender, self.predecessor, "nlp_sum_hop")
        if self.nlp_key is None or self.k == 0 or msg.hops != self.k or self._summed:
            raise fail(f"{self.name}: nlp_sum_hop after {msg.hops} hops out of order")
        enc = self._parse_matrices(msg, "nlp_sum_hop", terms=self.k)
        self._summed = True
        enc = {w: e.add_plain(self._share[w]).rerandomize(self._obf) for w, e in enc.items()}
        return self._forward_sum(enc, hops=self.k + 1)

    def _on_nlp_permute_hop(self, sender: str, msg: cels_pb2.NlpPermuteHop) -> list[Outgoing]:
        """Algorithm 2 lines 10-11: permute the variables of AT with pi_k, re-randomise."""
        self._expect_sender(sender, self.parties[-1] if self.k == 0 else self.predecessor, "nlp_permute_hop")
        if self.nlp_key is None or msg.hops != self.k or self.pi is not None:
            raise fail(f"{self.name}: nlp_permute_hop after {msg.hops} permutations out of order")
        at = self._parse_matrices(msg, "nlp_permute_hop", terms=self.r, which=("at",))["at"]
        self.pi = self._rng.permutation(len(self.active)).astype(np.int64)
        at = at.permute_columns(self.pi).rerandomize(self._obf)
        hop = cels_pb2.NlpPermuteHop(session_id=self.session_id, hops=self.k + 1, at=codec.matrix_message(at))
        return self._send(self.successor if self.k < self.r - 1 else self.solver, nlp_permute_hop=hop)

    def _on_nlp_solution(self, sender: str, msg: cels_pb2.NlpSolution) -> list[Outgoing]:
        """Undo pi_r .. pi_1 in reverse order (Algorithm 2, last line); P_1 shares the result."""
        final = msg.unpermuted == self.r
        if final:
            self._expect_sender(sender, self.parties[0], "nlp_solution")
            if self.k == 0:
                raise fail(f"{self.name}: final nlp_solution sent back to P_1")
        else:
            expected = self.solver if self.k == self.r - 1 else self.successor
            self._expect_sender(sender, expected, "nlp_solution")
            if msg.unpermuted != self.r - 1 - self.k or self.pi is None:
                raise fail(f"{self.name}: nlp_solution un-permuted {msg.unpermuted} times out of order")
        x = np.asarray(msg.x, dtype=np.uint64)
        if x.shape != (len(self.active),):
            raise malformed(f"{self.name}: nlp_solution has {x.shape[0]} counts for {len(self.active)} variables")
        if x.size and x.max() > MAX_SOLUTION_COUNT:
            raise self.refuse_and_abort(f"{self.name}: nlp_solution holds a count {int(x.max())} above {MAX_SOLUTION_COUNT} (2^53)")
        x = x.astype(np.int64)
        if not final:
            unpermuted = np.empty_like(x)
            unpermuted[self.pi] = x  # permuted column j was column perm[j]
            x = unpermuted
            step = cels_pb2.NlpSolution(
                session_id=self.session_id, unpermuted=msg.unpermuted + 1, x=x.tolist(),
                solver_report_json=msg.solver_report_json,
            )
            if self.k > 0:
                return self._send(self.predecessor, nlp_solution=step)
            out = self._send(self.parties[1:], nlp_solution=step)
        else:
            out = []
        try:
            report = {"solve": "transformed", **json.loads(msg.solver_report_json or "{}")}
        except ValueError as exc:
            raise malformed(f"{self.name}: solver report is not JSON: {exc}") from None
        return out + self._solution(x, report)

    def _solution(self, x: np.ndarray, solver_report: dict) -> list[Outgoing]:
        """Check this party's exact conditions on x, then sample."""
        self.solver_report = solver_report
        load = self.rows @ x.astype(np.float64)
        if np.any(load > self.b):
            worst = float(load.max())
            raise RoleFailure("the solution breaks one of its conditions", f"the solution breaks one of this party's conditions ({worst:.6g} > b = {self.b:.6g})")
        self.x = x
        self._enter(Phase.SAMPLING)
        if self.options.sampling == "paper":
            return self._paper_sampling()
        self._sampler = StagedSampler(self.local[:, self.active], self.totals[self.active], x, self._rng, self.options.sampling_theta)
        return self._next_stage()

    # -- phase 4: sampling ------------------------------------------------------------------------
    def _next_stage(self) -> list[Outgoing]:
        if self._sampler.done:
            return self._union(self._sampler.result())
        _pairs, local = self._sampler.propose()
        return self._start_sum(f"sampling-{self._sampler.stage}", local)

    def _sampling_stage_done(self, total: np.ndarray) -> list[Outgoing]:
        try:
            self._sampler.settle(total)
        except ValueError as exc:
            raise malformed(f"{self.name}: sampling stage totals: {exc}") from None
        return self._next_stage()

    def _paper_sampling(self) -> list[Outgoing]:
        """The paper's local sampling: floor(x_i c_i^k / c_i) trials over this party's users."""
        local = self.local[:, self.active]
        trials = paper_trials(np.asarray(local.sum(axis=0)).ravel(), self.totals[self.active], self.x)
        return self._union(sp.csr_matrix(multinomial_sample(local, trials, self._rng)))

    # -- phase 5: secure union (Algorithm 3, shuffled) --------------------------------------------
    def _records(self, sampled: sp.csr_matrix) -> list[bytes]:
        """(user pseudonym, query, url, count) for every x_ij > 0 of this party's users."""
        sampled = sp.csr_matrix(sampled)
        sampled.eliminate_zeros()
        users = np.flatnonzero(np.diff(sampled.indptr))
        names = [self.log.users[j] for j in users] if self.options.keep_user_ids else pseudonyms(len(users), self._rng)
        out = []
        for j, user in zip(users, names):
            lo, hi = sampled.indptr[j], sampled.indptr[j + 1]
            for col, count in zip(sampled.indices[lo:hi], sampled.data[lo:hi]):
                query, url = self.log.pairs[self.pair_of[int(self.active[col])]]
                out.append(encode_item(user, query, url, int(count)))
        return out

    def _union(self, sampled: sp.csr_matrix) -> list[Outgoing]:
        self._enter(Phase.UNION)
        self.sampled = sampled
        self._secure_union = SecureUnion(
            name=self.name, session_id=self.session_id, ring=self.parties, records=self._records(sampled),
            group=group_for_bits(self.options.group_bits, allow_paper_bits=self._allow_insecure), rng=self._rng,
        )
        return self._secure_union.start()

    def _on_union(self, sender: str, envelope) -> list[Outgoing]:
        out = self._secure_union.receive(sender, envelope)
        if self._secure_union.done:
            if self.name == self.initiator:
                self._output(self._secure_union.result)
            self._finish()
        return out

    # -- the initiator: output and report -------------------------------------------------------
    def _output(self, records: list[bytes]) -> None:
        """The union in the input's schema (records decode to (user, query, url, count))."""
        self.output = SearchLog.from_records((union_record(r) for r in records), source=self.log.source)

    def _report(self) -> list[Outgoing]:
        if self.name != self.initiator:
            return super()._report()
        self.reports.extend(self.step_reports())
        self._complete_report()
        return []

    def _on_step_report(self, sender: str, msg: cels_pb2.StepReport) -> list[Outgoing]:
        if self.name != self.initiator or msg.node != sender:
            raise fail(f"{self.name}: step_report of {msg.node!r} from {sender!r}")
        self.reports.append(msg)
        self._complete_report()
        return []

    def _complete_report(self) -> None:
        """Once the output is in and every node has reported: the session report."""
        reported = {r.node for r in self.reports if r.last}  # every StepReport of every node is in
        if self.output is None or reported != set(self.nodes):
            return
        self.report = self._session_report()

    @property
    def finished(self) -> bool:
        """The initiator is finished once it holds the output and every node's report."""
        return self.report is not None if self.name == self.initiator else self.done

    def _session_report(self) -> dict:
        """The same privacy / solver / utility keys as ``cels sanitize``, plus per-phase costs."""
        phases: dict[str, dict] = {}
        for rep in self.reports:
            entry = phases.setdefault(codec.phase_label(rep.phase), {"seconds": {}, "bytes": {}})
            entry["seconds"][rep.node] = rep.seconds
            entry["bytes"][rep.node] = rep.bytes_sent
        for entry in phases.values():
            entry["seconds_total"] = sum(entry["seconds"].values())
            entry["bytes_total"] = sum(entry["bytes"].values())
        opts = self.options
        x_all = np.zeros(self.n, dtype=np.int64)
        x_all[self.active] = self.x
        cleaned = self.totals >= max(opts.min_count, 1)
        return {
            "method": "cels-protocol",
            "privacy": {**session_privacy(opts, self.b), "min_count": opts.min_count},
            "solver": self.solver_report,
            "noise": self.solver_report.get("noise"),
            "utility": {
                **metrics.utility_report(self.totals[cleaned], x_all[cleaned], support=opts.support),
                "against": "the summed pair totals c after the cap (the parties never see the uncapped sum)",
            },
            "sizes": {
                "parties": self.r,
                "pairs": int(self.n),
                "unique_pairs": self.unique_pairs,
                "nonunique_pairs": int(len(self.active)),
                **(
                    {"constraint_rows": dict(zip(self.parties, self.shape_rows)), "ell": int(self.ell)}
                    if opts.solve == "transformed"
                    else {}  # the private solve tells no party another party's number of rows
                ),
                "output_records": int(self.output.counts.nnz),
                "output_size": int(self.output.size),
            },
            "sampling": {
                "mode": opts.sampling,
                "stages": self._sampler.stage if self._sampler is not None else 0,
                "theta": opts.sampling_theta,
            },
            "solve": {
                "mode": opts.solve,
                **({"rounds": self.solver_report["rounds"], "round_batch": opts.round_batch} if opts.solve == "private" else {}),
                "bytes": phases.get(solve_phase(opts.solve), {}).get("bytes_total", 0),
                "seconds": phases.get(solve_phase(opts.solve), {}).get("seconds_total", 0.0),
            },
            "universe_cipher": opts.universe_cipher,
            "key_bits": opts.key_bits,
            "group_bits": opts.group_bits,
            "phases": phases,
            "bytes_total": int(sum(e["bytes_total"] for e in phases.values())),
        }

    ACCEPTS = {
        "universe_hop": accepts(Phase.UNIVERSE, _on_universe_hop),
        "universe_index": accepts(Phase.UNIVERSE, _on_universe_index),
        "sum_key": accepts((Phase.COUNTS, Phase.SAMPLING), _on_sum_message, whole=True),
        "sum_hop": accepts((Phase.COUNTS, Phase.SAMPLING), _on_sum_message, whole=True),
        "sum_result": accepts((Phase.COUNTS, Phase.SAMPLING), _on_sum_message, whole=True),
        "masked_sum_share": accepts((Phase.COUNTS, Phase.SAMPLING), _on_sum_message, whole=True),
        "nlp_key": accepts(Phase.NLP, _on_nlp_key),
        "nlp_sum_hop": accepts(Phase.NLP, _on_nlp_sum_hop),
        "nlp_permute_hop": accepts(Phase.NLP, _on_nlp_permute_hop),
        "nlp_solution": accepts(Phase.NLP, _on_nlp_solution),
        "mask_key": accepts((Phase.UNIVERSE, Phase.COUNTS, Phase.SOLVE), _on_mask_key),
        "round_verdict": accepts(Phase.SOLVE, _on_round_verdict),
        "noise_total": accepts(Phase.SOLVE, _on_noise_total),
        "transcript_digest": accepts(Phase.SOLVE, _on_transcript_digest),
        "union_encrypt_hop": accepts(Phase.UNION, _on_union, whole=True),
        "union_decrypt_hop": accepts(Phase.UNION, _on_union, whole=True),
        "union_result": accepts(Phase.UNION, _on_union, whole=True),
        "step_report": accepts((Phase.UNIVERSE, Phase.COUNTS, Phase.NLP, Phase.SOLVE, Phase.SAMPLING, Phase.UNION, Phase.OVER), _on_step_report),
    }
    """Which step message P_k takes in which phase (the initiator also takes StepReports)."""
