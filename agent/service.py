"""The node agent: register, heartbeat, run what the control plane commands, report facts.

It consumes only its own command subject (`hf.node.<id>.cmd`) through a durable consumer,
publishes reports on `hf.node.<id>.report` (JetStream, acknowledged) and heartbeats on
`hf.node.<id>.heartbeat` (core NATS: a lost beat is just a missed beat), and answers log
requests on `hf.node.<id>.logs`. Restarted, it re-adopts the containers it started (by label)
instead of restarting them. Each attempt runs at most once here: a START for an attempt this
node already started or ended is answered from its durable record (agent/attempts.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import shutil
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import structlog
from nats.aio.client import Client
from nats.js import JetStreamContext

from libs.bus.broker import serve
from libs.bus.nats import when_jetstream_answers
from libs.bus.permissions import agent_inbox_prefix
from libs.bus.subjects import (
    escape_token,
    node_heartbeat_subject,
    node_report_subject,
    node_telemetry_subject,
)
from libs.domain.protocol import (
    AgentReport,
    CommandKind,
    Fact,
    Heartbeat,
    LogsReply,
    LogsRequest,
    NodeCommand,
    Registration,
)
from libs.domain.task.failure import ErrorKind
from libs.domain.task.liveness import TaskLiveness
from libs.domain.task.states import TaskStatus
from libs.domain.telemetry import TelemetryBatch
from libs.installation import installation_id
from libs.periodic import periodic

from .attempts import AttemptRecord
from .device_log import KernelLog
from .engine import put_to_sleep, vram_held_mb, wake_from_sleep
from .inventory import Inventory, detect_inventory, visible_gpu_ids
from .launch import engine_profile, run_spec
from .liveness import collect as collect_liveness
from .recheck import checked
from .reporter import Reporter
from .retention import Retention
from .routes import routes
from .runtimes.base import ExitReport, Handle, RunSpec, Runtime, RuntimeStartError
from .settings import AgentSettings as AgentSettings
from .settings import declared, node_inventory
from .telemetry import holders_of, sample
from .tracked import Tracked, spec_of
from .vendors import Runner, Which, recorded_tools, run_tool, telemetry_notes
from .xid_events import XidWatch, ecc_counts, ecc_lines

log = structlog.get_logger(__name__)
S = TaskStatus


@dataclass
class Agent:
    settings: AgentSettings
    nc: Client
    js: JetStreamContext
    runtime: Runtime
    inventory: Inventory
    tracked: dict[str, Tracked] = field(default_factory=dict)
    seq: int = 0
    liveness: dict[str, TaskLiveness] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.reporter = Reporter(self.js)
        self.retention = Retention(
            self.runtime.remove,
            keep=self.settings.finished_keep,
            keep_s=self.settings.finished_keep_s,
            enabled=self.settings.remove_finished,
        )
        self.attempts = AttemptRecord(
            self.settings.resolved_state_dir(), keep_s=self.settings.attempt_record_keep_s
        )
        self.xids = XidWatch()
        # dmesg where the node looks for real cards; a named file wherever one is set.
        self.kernel_log = KernelLog(self.settings.kernel_log, use_dmesg=self.settings.detect_nvidia)

    @property
    def node_id(self) -> str:
        return self.settings.node_id

    # --- lifecycle ---------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        await self.register()
        await self.readopt()
        mine = routes(
            escape_token(self.node_id),
            f"agent-{self.node_id}",
            command=self.on_command,
            logs=self.on_logs,
            max_in_flight=self.settings.agent_max_concurrent_commands,
            inbox_prefix=agent_inbox_prefix(self.node_id),
        )
        try:
            await asyncio.gather(
                self._heartbeats(stop),
                self._liveness(stop),
                self._telemetry(stop),
                self._xid_events(stop),
                self._retention(stop),
                self._attempt_record(stop),
                self.reporter.run(stop),
                serve(self.nc, [mine], stop),
            )
        finally:
            for t in self.tracked.values():
                if t.waiter:
                    t.waiter.cancel()

    async def _xid_events(self, stop: asyncio.Event) -> None:
        """NVML's XID events of this node's cards, watched in a thread until `stop`."""
        if not self.settings.detect_nvidia:
            return
        watching = asyncio.ensure_future(asyncio.to_thread(self.xids.run))
        stopping = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({watching, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self.xids.stop()
            stopping.cancel()
            await asyncio.gather(watching, return_exceptions=True)

    async def _retention(self, stop: asyncio.Event) -> None:
        """Remove finished attempts past their age (the count is applied at each exit)."""
        keep_s = self.settings.finished_keep_s
        if keep_s <= 0 or not self.settings.remove_finished:
            return
        await periodic("retention", self.retention.prune, stop, min(60.0, max(1.0, keep_s / 10)))

    async def _attempt_record(self, stop: asyncio.Event) -> None:
        """Forget attempts that ended long ago (agent/attempts.py); never a tracked one."""
        keep_s = self.settings.attempt_record_keep_s
        if keep_s <= 0:
            return

        async def prune() -> None:
            live = {(t.handle.task_id, t.handle.attempt) for t in self.tracked.values()}
            await asyncio.to_thread(self.attempts.prune, live.__contains__)

        await periodic("attempt_record", prune, stop, min(3600.0, max(1.0, keep_s / 10)))

    async def register(self) -> None:
        run, which = self._vendor_tools()
        vendors = [g.vendor for g in self.inventory.gpus]
        # Each vendor's tool is tried once (it may take seconds): off the event loop.
        notes = await asyncio.to_thread(telemetry_notes, vendors, which, run)
        reg = Registration(
            node_id=self.node_id,
            at=_now(),
            inventory=node_inventory(self.inventory, self.settings.address, notes),
        )
        body = reg.model_dump_json().encode()
        # A registration twice changes nothing: sent again while JetStream elects a leader.
        await when_jetstream_answers(
            "registration",
            functools.partial(self.js.publish, node_report_subject(self.node_id), body),
        )
        log.info(
            "agent_registered",
            node_id=self.node_id,
            runtime=self.runtime.name,
            gpus=len(self.inventory.gpus),
        )
        for vendor, note in notes.items():
            log.warning("gpu_telemetry_unavailable", node_id=self.node_id, vendor=vendor, note=note)

    async def readopt(self) -> None:
        """Pick up containers started before a restart; report what happened meanwhile.
        One task may have several attempts' containers: the newest is adopted, the older
        ones are stopped (their attempts are over; retention removes them later)."""
        keep, older = newest_attempts(await self.runtime.list_managed())
        for handle in older:
            try:
                await self.runtime.stop(handle, grace_s=5.0)
                log.info("older_attempt_stopped", task_id=handle.task_id, attempt=handle.attempt)
            except Exception:
                log.exception("older_attempt_stop_failed", task_id=handle.task_id)
        for handle in keep:
            try:
                state = await self.runtime.inspect(handle)
                if state.value == "missing":
                    continue
                # Recorded before anything is reported: a START redelivered for it later
                # is answered from the record once it has ended and been removed.
                try:
                    await asyncio.to_thread(self.attempts.started, handle.task_id, handle.attempt)
                except OSError:  # it runs already: adopted all the same
                    log.exception("attempt_not_recorded", task_id=handle.task_id)
                self.tracked[handle.task_id] = Tracked(handle, S.RUNNING)
                log.info("container_readopted", task_id=handle.task_id, state=state.value)
                self.report(handle, Fact.RUNNING, S.RUNNING)  # sent once the reporter runs
                self._watch(handle.task_id)
            except Exception:  # one bad container must not keep the agent from starting
                log.exception("readopt_failed", task_id=handle.task_id)

    async def _heartbeats(self, stop: asyncio.Event) -> None:
        declared = [g for g in self.inventory.gpus if g.declared]

        async def beat() -> None:
            self.seq += 1
            # NVML calls block (nvmlInit alone can take a second on a card without
            # persistence mode): keep them off the event loop.
            visible = await asyncio.to_thread(
                visible_gpu_ids,
                declared,
                self.settings.resolved_state_dir(),
                detect=self.settings.detect_nvidia,
            )
            hb = Heartbeat(
                node_id=self.node_id,
                seq=self.seq,
                visible_gpus=visible,
                tasks=sorted(self.tracked),
                liveness={k: v for k, v in self.liveness.items() if k in self.tracked},
                at=_now(),
            )
            await self.nc.publish(
                node_heartbeat_subject(self.node_id), hb.model_dump_json().encode()
            )

        await periodic("heartbeat", beat, stop, self.settings.heartbeat_interval_s)

    async def _liveness(self, stop: asyncio.Event) -> None:
        """Evidence of each inference task for the next heartbeats (agent/liveness.py)."""

        async def look() -> None:
            # A task the platform put to sleep is frozen on purpose: no evidence either way.
            watched = [
                (tid, t.handle, t.health_url)
                for tid, t in self.tracked.items()
                if t.inference and t.expected is S.RUNNING
            ]
            self.liveness = await collect_liveness(self.runtime, watched)

        await periodic("liveness", look, stop, self.settings.heartbeat_interval_s)

    async def _telemetry(self, stop: asyncio.Event) -> None:
        """Samples of the cards running tasks hold: NVML, then other vendors' tools."""
        detect = self.settings.detect_nvidia
        cards = [g for g in self.inventory.gpus if g.vendor != "nvidia"]
        if not detect and not cards:
            return
        run, which = self._vendor_tools()

        async def sample_once() -> None:
            holders = holders_of((tid, t.gpu_ids) for tid, t in self.tracked.items())
            samples = await asyncio.to_thread(
                functools.partial(
                    sample, holders, _now(), cards=cards, detect=detect, run=run, which=which
                )
            )
            if samples:
                batch = TelemetryBatch(node_id=self.node_id, samples=tuple(samples))
                await self.nc.publish(
                    node_telemetry_subject(self.node_id), batch.model_dump_json().encode()
                )

        await periodic("telemetry", sample_once, stop, self.settings.telemetry_interval_s)

    # --- commands ----------------------------------------------------------------------

    async def on_command(self, cmd: NodeCommand) -> None:
        log.info("command_received", kind=cmd.kind.value, task_id=cmd.task_id)
        if cmd.kind is CommandKind.START:
            await self.start(cmd)
        elif cmd.kind is CommandKind.STOP:
            await self.stop(cmd)
        elif cmd.kind is CommandKind.PAUSE:
            await self.pause(cmd)
        elif cmd.kind is CommandKind.RESUME:
            await self.resume(cmd)

    async def start(self, cmd: NodeCommand) -> None:
        known = self.tracked.get(cmd.task_id)
        if known and known.handle.attempt == cmd.attempt:
            # A redelivered start, or this attempt placed here again after the node was
            # declared offline: it already runs, so say so (a `running` task ignores it).
            await self.report(known.handle, Fact.RUNNING, S.SCHEDULED)
            return
        if self.attempts.get(cmd.task_id, cmd.attempt) is not None:
            await self._answer_from_record(cmd)
            return
        run, timeout = run_spec(
            cmd, self.inventory, self.node_id, self.settings.address, self.runtime.name
        )
        pseudo = Handle(runtime=self.runtime.name, id="", task_id=cmd.task_id, attempt=cmd.attempt)
        # Queued, not awaited: the process starts while the report is on its way (the
        # reporter keeps it ahead of this task's next report).
        self.report(pseudo, Fact.STARTING, S.SCHEDULED)
        try:
            # Each volume resolved on this host (a thread: a slow mount must not stall
            # the loop); the runtime mounts the resolved path. Without volumes the check
            # touches no file, and runs here (a thread hand-off costs more than it).
            allow = self.settings.volume_allow_list
            run, why = (
                await asyncio.to_thread(checked, run, allow) if run.volumes else checked(run, allow)
            )
            if why:
                log.warning("command_refused", task_id=cmd.task_id, reason=why)
                raise RuntimeStartError(ErrorKind.INVALID_CONFIG, f"refused by the node: {why}")
            handle = await self.runtime.start(run)
        except RuntimeStartError as exc:
            await self._final(
                pseudo, Fact.START_FAILED, S.STARTING, error_kind=exc.kind, error=exc.message
            )
            return
        await self._record_started(handle)
        mark = await asyncio.to_thread(self.kernel_log.mark) if run.gpu_ids else -1
        nvidia = self.settings.detect_nvidia and bool(run.gpu_ids)
        ecc = await asyncio.to_thread(ecc_counts, run.gpu_ids) if nvidia else None
        self.tracked[cmd.task_id] = Tracked(
            handle,
            S.RUNNING,
            timeout_s=timeout,
            gpu_ids=run.gpu_ids,
            kernel_mark=mark,
            started_wall=time.time(),
            ecc_at_start=ecc,
        )
        address = await self._endpoint(handle, run)
        tracked = self.tracked[cmd.task_id]
        tracked.serve_address, tracked.inference = address, spec_of(cmd).is_inference
        serving = spec_of(cmd).serving
        tracked.health_path = serving.health_path if serving else ""
        running = self.report(
            handle,
            Fact.RUNNING,
            S.STARTING,
            memory_mb=run.memory_mb,
            serve_address=address,
            engine=engine_profile(cmd, self.inventory),
        )
        self._watch(cmd.task_id)
        # The command is acknowledged once its reports are on the stream: a crash before
        # that redelivers it, and the runtime's idempotent start finds the process.
        await running

    async def _record_started(self, handle: Handle) -> None:
        """Durably note an attempt the runtime now holds. Until its end is recorded, what
        the runtime holds of it answers a START (the runtime's idempotent start, or
        `_answer_from_record`); noted only after the start, an attempt recorded but absent
        from the runtime was removed by someone else: it ran, and is reported lost."""
        try:
            await asyncio.to_thread(self.attempts.started, handle.task_id, handle.attempt)
        except OSError:  # it runs: the runtime's own guard still covers it
            log.exception("attempt_not_recorded", task_id=handle.task_id)

    async def _answer_from_record(self, cmd: NodeCommand) -> None:
        """A START for an attempt this node already started: never run again. Ended, its
        final report is sent again; still held by the runtime, it is adopted; else what it
        left was removed by someone else (the agent removes only recorded ends): it is
        reported lost, its outcome unknown, and the retry policy decides."""
        entry = self.attempts.get(cmd.task_id, cmd.attempt)
        assert entry is not None
        recorded = entry.report.fact.value if entry.report else "started"
        log.info(
            "start_answered_from_record",
            task_id=cmd.task_id,
            attempt=cmd.attempt,
            recorded=recorded,
        )
        if entry.report is not None:
            await self._send(entry.report.model_copy(update={"at": _now()}))
            return
        found = [
            h
            for h in await self.runtime.list_managed()
            if (h.task_id, h.attempt) == (cmd.task_id, cmd.attempt)
        ]
        if found and (await self.runtime.inspect(found[0])).value != "missing":
            self.tracked[cmd.task_id] = Tracked(found[0], S.RUNNING)
            self._watch(cmd.task_id)
            await self.report(found[0], Fact.RUNNING, S.SCHEDULED)
            return
        log.warning("recorded_attempt_lost", task_id=cmd.task_id, attempt=cmd.attempt)
        pseudo = Handle(runtime=self.runtime.name, id="", task_id=cmd.task_id, attempt=cmd.attempt)
        await self._final(
            pseudo,
            Fact.LOST,
            S.STARTING,
            error_kind=ErrorKind.CONTAINER_RUNTIME_ERROR,
            error="the attempt ran on this node and its container or task directory is gone",
        )

    async def _endpoint(self, handle: Handle, run: RunSpec) -> str:
        try:
            return await self.runtime.endpoint(handle, run)
        except Exception:  # the task runs; the router just cannot reach it
            log.exception("serve_endpoint_unknown", task_id=handle.task_id)
            return ""

    def _watch(self, task_id: str) -> None:
        tracked = self.tracked[task_id]
        tracked.waiter = asyncio.create_task(self._wait(task_id, tracked))

    async def _wait(self, task_id: str, tracked: Tracked) -> None:
        try:
            if tracked.timeout_s > 0:
                try:
                    result = await asyncio.wait_for(
                        self.runtime.wait(tracked.handle), tracked.timeout_s
                    )
                except TimeoutError:
                    tracked.timed_out = True
                    await self.runtime.stop(tracked.handle, grace_s=10.0)
                    result = await self.runtime.wait(tracked.handle)
            else:
                result = await self.runtime.wait(tracked.handle)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("wait_failed", task_id=task_id)
            result = ExitReport(exit_code=None, error=f"ContainerRuntimeError: {exc}")
        if await self._report_exit(task_id, tracked, result):
            await self.retention.finished(tracked.handle, result.finished_at.timestamp())
        # else its end is not recorded: what the runtime keeps of it answers a START instead

    async def _report_exit(self, task_id: str, tracked: Tracked, result: ExitReport) -> bool:
        """Report the exit; whether its end was recorded."""
        kind, _, detail = (result.error or "").partition(": ")
        extra: dict[str, Any] = {}
        if tracked.timed_out:
            extra = {"error_kind": ErrorKind.TIMEOUT, "error": "task exceeded its timeout"}
        elif result.error and (known := ErrorKind.parse(kind)) is not None:
            extra = {"error_kind": known, "error": detail or kind}
        elif result.error:
            extra = {"error": result.error}  # a cause that names no kind: kept as text
        if not result.succeeded:
            seen = self.xids.since(tracked.gpu_ids, tracked.started_wall)
            if result.xids or seen:
                extra["xids"] = [*result.xids, *(x for x in seen if x not in result.xids)]
        lines: list[str] = []
        if not result.succeeded and tracked.kernel_mark >= 0:
            lines = await asyncio.to_thread(self.kernel_log.since, tracked.kernel_mark)
        if not result.succeeded and tracked.ecc_at_start:
            now = await asyncio.to_thread(ecc_counts, tracked.ecc_at_start)
            lines += ecc_lines(tracked.ecc_at_start, now)
        if lines:
            extra["device_log"] = lines
        return await self._final(
            tracked.handle,
            Fact.EXITED,
            tracked.expected,
            untrack=task_id,
            exit_code=result.exit_code,
            oom_killed=result.oom_killed,
            output_tail=result.output_tail[-50:],
            **extra,
        )

    async def stop(self, cmd: NodeCommand) -> None:
        tracked = self.tracked.get(cmd.task_id)
        if tracked is None or tracked.handle.attempt > cmd.attempt:
            # Nothing of ours runs it: say so, so a `stopping` task can end. (A stop for a
            # later attempt does stop an older one here: that attempt is over anyway.)
            pseudo = Handle(
                runtime=self.runtime.name, id="", task_id=cmd.task_id, attempt=cmd.attempt
            )
            await self.report(pseudo, Fact.EXITED, cmd.status, exit_code=None)
            return
        tracked.expected = cmd.status
        with contextlib.suppress(Exception):
            await self.runtime.unpause(tracked.handle)  # a paused process cannot stop
        await self.runtime.stop(tracked.handle, grace_s=cmd.grace_s)

    async def pause(self, cmd: NodeCommand) -> None:
        """Sleep: through the engine's sleep endpoint when it has one (VRAM is released),
        else by freezing the container (which frees no VRAM). agent/engine.py."""
        tracked = self.tracked.get(cmd.task_id)
        if tracked is None:
            return
        tracked.engine_slept, fields = await put_to_sleep(
            self.runtime, tracked.handle, tracked.serve_address, self._vram(tracked)
        )
        tracked.expected = S.SLEEPING
        await self.report(tracked.handle, Fact.PAUSED, S.SLEEPING, **fields)

    async def resume(self, cmd: NodeCommand) -> None:
        tracked = self.tracked.get(cmd.task_id)
        if tracked is None:
            return
        tracked.engine_slept, fields = await wake_from_sleep(
            self.runtime,
            tracked.handle,
            tracked.serve_address,
            tracked.engine_slept,
            self._vram(tracked),
        )
        tracked.expected = S.RUNNING
        await self.report(tracked.handle, Fact.RESUMED, S.WAKING, **fields)

    def _vendor_tools(self) -> tuple[Runner, Which]:
        """The vendor tools themselves, or their recorded outputs (simulated nodes)."""
        if self.settings.vendor_tool_outputs is not None:
            return recorded_tools(self.settings.vendor_tool_outputs)
        return run_tool, shutil.which

    def _vram(self, tracked: Tracked) -> Callable[[], Awaitable[float | None]]:
        detect, declared = self.settings.detect_nvidia, self.settings.declared_vram_file
        cards, tools = self.inventory.gpus, self._vendor_tools()
        return lambda: vram_held_mb(tracked.gpu_ids, detect, declared, cards, tools)

    # --- reports and logs --------------------------------------------------------------

    def report(
        self, handle: Handle, fact: Fact, expected: TaskStatus, **fields: Any
    ) -> asyncio.Future[None]:
        """Queue a report; the future resolves when the stream has it (see reporter.py)."""
        return self._send(self._make(handle, fact, expected, **fields))

    async def _final(
        self,
        handle: Handle,
        fact: Fact,
        expected: TaskStatus,
        *,
        untrack: str | None = None,
        **fields: Any,
    ) -> bool:
        """An attempt's last report: recorded before it is sent, and before the attempt is
        no longer tracked (`untrack`), so a START is always answered by one or the other.
        Whether the record has it."""
        rep = self._make(handle, fact, expected, **fields)
        recorded = True
        try:
            await asyncio.to_thread(self.attempts.ended, rep)
        except OSError:
            log.exception("attempt_end_not_recorded", task_id=handle.task_id)
            recorded = False
        if untrack is not None:
            self.tracked.pop(untrack, None)
        await self._send(rep)
        return recorded

    def _make(self, handle: Handle, fact: Fact, expected: TaskStatus, **fields: Any) -> AgentReport:
        return AgentReport(
            node_id=self.node_id,
            task_id=handle.task_id,
            attempt=handle.attempt,
            fact=fact,
            expected_status=expected,
            container_id=handle.id,
            at=_now(),
            **fields,
        )

    def _send(self, rep: AgentReport) -> asyncio.Future[None]:
        return self.reporter.put(node_report_subject(self.node_id), rep.model_dump_json().encode())

    def _handle_for(self, task_id: str) -> Handle | None:
        tracked = self.tracked.get(task_id)
        return tracked.handle if tracked else self.retention.handle_for(task_id)

    async def on_logs(self, req: LogsRequest) -> LogsReply:
        try:
            handle = self._handle_for(req.task_id)
            if handle is None:
                handle = await self._find_handle(req.task_id)
            if handle is None:
                return LogsReply(found=False)
            lines = await self.runtime.logs(handle, tail=req.tail)
            return LogsReply(found=True, lines=lines, running=req.task_id in self.tracked)
        except Exception as exc:  # the requester gets an answer, never a hang
            return LogsReply(found=False, error=str(exc))

    async def _find_handle(self, task_id: str) -> Handle | None:
        handles = [h for h in await self.runtime.list_managed() if h.task_id == task_id]
        return max(handles, key=lambda h: h.attempt) if handles else None


def _now() -> datetime:
    return datetime.now(UTC)


async def run_agent(
    settings: AgentSettings,
    nc: Client,
    js: JetStreamContext,
    stop: asyncio.Event,
    runtime: Runtime | None = None,
) -> None:
    from .runtimes import choose_runtime_kind, create_runtime
    from .runtimes.networks import node_isolation

    state_dir = settings.resolved_state_dir()
    state_dir.mkdir(parents=True, exist_ok=True)
    # The docker ping and NVML discovery are blocking calls; in `heteroflow up` the agent
    # shares its event loop with the API, so they run in a thread.
    kind = (
        runtime.name if runtime else await asyncio.to_thread(choose_runtime_kind, settings.runtime)
    )
    runtime = runtime or create_runtime(
        kind,
        state_dir=state_dir,
        docker_options=settings.docker_options()
        | {"installation": settings.installation_id or installation_id(settings.home)},
        process_options=settings.process_options(),
    )
    detected = await asyncio.to_thread(
        detect_inventory,
        settings.node_id,
        declared=settings.declared_gpus or None,
        labels=settings.node_labels,
        detect=settings.detect_nvidia,
        runtime=kind,
    )
    detected = detected.model_copy(update=await asyncio.to_thread(runtime.node_facts))
    isolation = await asyncio.to_thread(node_isolation, runtime)
    detected = detected.model_copy(update={"isolation": isolation})
    agent = Agent(settings, nc, js, runtime, declared(detected, settings))
    try:
        await agent.run(stop)
    finally:
        await runtime.close()


def newest_attempts(handles: list[Handle]) -> tuple[list[Handle], list[Handle]]:
    """Split found containers into the newest attempt of each task and the older ones."""
    newest: dict[str, Handle] = {}
    for h in handles:
        if h.task_id not in newest or h.attempt > newest[h.task_id].attempt:
            newest[h.task_id] = h
    kept = set(map(id, newest.values()))
    return list(newest.values()), [h for h in handles if id(h) not in kept]
