/** Numbers, durations and times as people read them. */

export function count(n: number): string {
  return n.toLocaleString("en-US");
}

/** 850 ms, 12.3 s, 4 min 10 s, 2 h 5 min, 3 d 4 h. */
export function duration(ms: number): string {
  const abs = Math.abs(ms);
  if (abs < 1_000) return `${Math.round(abs)} ms`;
  if (abs < 60_000) return `${(abs / 1_000).toFixed(abs < 10_000 ? 1 : 0)} s`;
  if (abs < 3_600_000) return `${Math.floor(abs / 60_000)} min ${Math.floor((abs % 60_000) / 1_000)} s`;
  if (abs < 86_400_000) return `${Math.floor(abs / 3_600_000)} h ${Math.floor((abs % 3_600_000) / 60_000)} min`;
  return `${Math.floor(abs / 86_400_000)} d ${Math.floor((abs % 86_400_000) / 3_600_000)} h`;
}

export function ago(ms: number): string {
  return `${duration(ms)} ago`;
}

const TIME_PARTS = new Intl.DateTimeFormat("en-CA", {
  year: "numeric",
  month: "2-digit",
  day: "2-digit",
  hour: "2-digit",
  minute: "2-digit",
  second: "2-digit",
  hourCycle: "h23",
  timeZoneName: "short",
});

/** An ISO time in this browser's zone, always with its date and the zone's name: 2025-03-14 09:26:53 UTC. */
export function time(iso: string | null): string {
  if (!iso) return "–";
  const parts = TIME_PARTS.formatToParts(new Date(iso));
  const part = (type: Intl.DateTimeFormatPartTypes) => parts.find((p) => p.type === type)?.value ?? "";
  return `${part("year")}-${part("month")}-${part("day")} ${part("hour")}:${part("minute")}:${part("second")} ${part("timeZoneName")}`;
}

/** Milliseconds from now (by this browser's clock) to an ISO time; negative: in the past. */
export function untilNow(iso: string): number {
  return Date.now() - new Date(iso).getTime();
}

/** The first line of a text, shortened. */
export function short(text: string | null, max = 80): string {
  if (!text) return "";
  const first = text.split("\n")[0]!;
  return first.length > max ? `${first.slice(0, max - 1)}…` : first;
}

export function rate(perSecond: number): string {
  return perSecond >= 100 ? count(Math.round(perSecond)) : perSecond >= 10 ? perSecond.toFixed(1) : perSecond.toFixed(2);
}
