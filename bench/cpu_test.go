package bench

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cpuMeter measures the CPU a drain costs per row, split into this
// process (the relay, or the ceiling's client, the in-process broker and
// the sink) and the rest of the machine: on the benchmark's machine
// mostly the database servers, since nothing else should run meanwhile.
// On a 2-core machine both share the cores, so a relay that needs more
// CPU per row than a ceiling, in either part, drains slower than it even
// when neither waits for the other.
type cpuMeter struct {
	start       time.Time
	own         time.Duration // user + system time of this process
	busy, total uint64        // /proc/stat jiffies of the machine: busy and all
	machine     bool          // /proc/stat was read (Linux)
}

// cpuUse is what a drain cost.
type cpuUse struct {
	ownPerRow     float64 // µs of this process's CPU per row
	machinePerRow float64 // µs of the rest of the machine's CPU per row (0: unknown)
	busyCores     float64 // cores the whole machine kept busy on average (0: unknown)
}

func startCPU() cpuMeter {
	m := cpuMeter{start: time.Now(), own: ownCPU()}
	m.busy, m.total, _, m.machine = machineCPU()
	return m
}

// stop returns the cost per row of rows drained since m started.
func (m cpuMeter) stop(rows int) cpuUse {
	wall := time.Since(m.start)
	own := ownCPU() - m.own
	if rows <= 0 || wall <= 0 {
		return cpuUse{}
	}
	u := cpuUse{ownPerRow: float64(own.Microseconds()) / float64(rows)}
	busy, total, cores, ok := machineCPU()
	if !ok || !m.machine || total <= m.total {
		return u
	}
	// The share of all cores' time the machine was busy, over the wall
	// time, is the machine's CPU time; less this process's, the rest.
	u.busyCores = float64(cores) * float64(busy-m.busy) / float64(total-m.total)
	rest := u.busyCores*wall.Seconds() - own.Seconds()
	u.machinePerRow = max(rest, 0) * 1e6 / float64(rows)
	return u
}

// values adds u to out under prefix k.
func (u cpuUse) values(k string, out map[string]float64) {
	if u.ownPerRow > 0 {
		out[k+".cpu_own_us"] = u.ownPerRow
	}
	if u.busyCores > 0 {
		out[k+".cpu_rest_us"] = u.machinePerRow
		out[k+".busy_cores"] = u.busyCores
	}
}

func ownCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(syscall.TimevalToNsec(ru.Utime) + syscall.TimevalToNsec(ru.Stime))
}

// machineCPU reads /proc/stat: busy and all jiffies of every core
// (busy: all but idle, iowait and steal, the time a virtual machine's
// cores waited for the host), from its first line, and how many cores
// those add up (its cpuN lines: the machine's, not GOMAXPROCS).
func machineCPU() (busy, total uint64, cores int, ok bool) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, 0, false
	}
	lines := strings.Split(string(data), "\n")
	f := strings.Fields(lines[0])
	if len(f) < 9 || f[0] != "cpu" {
		return 0, 0, 0, false
	}
	// user nice system idle iowait irq softirq steal (guest time is in
	// user already).
	var v [8]uint64
	for i := range v {
		v[i], err = strconv.ParseUint(f[i+1], 10, 64)
		if err != nil {
			return 0, 0, 0, false
		}
	}
	for _, x := range v {
		total += x
	}
	for _, line := range lines[1:] {
		if len(line) > 3 && strings.HasPrefix(line, "cpu") && line[3] >= '0' && line[3] <= '9' {
			cores++
		}
	}
	return total - v[3] - v[4] - v[7], total, max(cores, 1), true
}
