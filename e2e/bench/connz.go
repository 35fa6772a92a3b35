package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// natsConn is one client connection of NATS's /connz: its counters are
// the server's, so "in" is what the client sent and "out" what the server
// delivered to it.
type natsConn struct {
	CID      uint64 `json:"cid"`
	Port     int    `json:"port"`
	Name     string `json:"name"`
	InMsgs   int64  `json:"in_msgs"`
	OutMsgs  int64  `json:"out_msgs"`
	InBytes  int64  `json:"in_bytes"`
	OutBytes int64  `json:"out_bytes"`
}

// connzLimit bounds the connections one /connz read returns; the
// benchmark's processes hold a few each.
const connzLimit = 4096

// natsConnz reads the client connections of NATS's /connz at addr, by
// connection id.
func natsConnz(ctx context.Context, addr string) (map[uint64]natsConn, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://%s/connz?limit=%d", addr, connzLimit), nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("NATS /connz: %w", err)
	}
	defer resp.Body.Close()
	var v struct {
		Connections []natsConn `json:"connections"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		return nil, fmt.Errorf("NATS /connz: %w", err)
	}
	out := make(map[uint64]natsConn, len(v.Connections))
	for _, c := range v.Connections {
		out[c.CID] = c
	}
	return out, nil
}

// busByProcess attributes the traffic of the connections in after since
// before (a connection opened in between counts from 0; one closed in
// between is lost) to the processes of pids that hold them, by the local
// TCP port of each process's sockets connected to NATS's natsPort: NATS's
// /connz names a client by its port, not its process, and every watcher
// shard connects with the same name. Connections no process of pids
// holds are left out.
func busByProcess(before, after map[uint64]natsConn, pids []int, natsPort int) (map[int]BusTraffic, error) {
	owners, err := clientPortOwners(pids, natsPort)
	if err != nil {
		return nil, err
	}
	out := map[int]BusTraffic{}
	for cid, a := range after {
		pid, ok := owners[a.Port]
		if !ok {
			continue
		}
		b := before[cid] // zero when the connection is new
		t := out[pid]
		t.InMsgs += a.InMsgs - b.InMsgs
		t.OutMsgs += a.OutMsgs - b.OutMsgs
		t.InBytes += a.InBytes - b.InBytes
		t.OutBytes += a.OutBytes - b.OutBytes
		out[pid] = t
	}
	return out, nil
}

// clientPortOwners returns, for the TCP sockets the processes of pids hold
// open to remotePort, the process of each local port (IPv4 and IPv6).
func clientPortOwners(pids []int, remotePort int) (map[int]int, error) {
	inodes := map[uint64]int{} // socket inode -> pid
	for _, pid := range pids {
		fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		if err != nil {
			return nil, fmt.Errorf("sockets of process %d: %w", pid, err)
		}
		for _, fd := range fds {
			link, err := os.Readlink(filepath.Join(fmt.Sprintf("/proc/%d/fd", pid), fd.Name()))
			if err != nil {
				continue // closed meanwhile
			}
			if n, ok := strings.CutPrefix(link, "socket:["); ok {
				if inode, err := strconv.ParseUint(strings.TrimSuffix(n, "]"), 10, 64); err == nil {
					inodes[inode] = pid
				}
			}
		}
	}
	out := map[int]int{}
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		socks, err := tcpSockets(table)
		if err != nil {
			return nil, err
		}
		for inode, s := range socks {
			if pid, ok := inodes[inode]; ok && s.remote == remotePort {
				out[s.local] = pid
			}
		}
	}
	return out, nil
}

// tcpPorts are the local and remote ports of a TCP socket.
type tcpPorts struct{ local, remote int }

// tcpSockets reads a /proc/net/tcp table: the ports of each socket, by
// inode. A missing table (no IPv6) is empty.
func tcpSockets(path string) (map[uint64]tcpPorts, error) {
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[uint64]tcpPorts{}
	sc := bufio.NewScanner(f)
	sc.Scan() // the header
	for sc.Scan() {
		// sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode ...
		f := strings.Fields(sc.Text())
		if len(f) < 10 {
			return nil, fmt.Errorf("%s: short line %q", path, sc.Text())
		}
		local, err := hexPort(f[1])
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		remote, err := hexPort(f[2])
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		inode, err := strconv.ParseUint(f[9], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%s: inode %q: %w", path, f[9], err)
		}
		if inode != 0 { // 0: TIME_WAIT, held by no process
			out[inode] = tcpPorts{local: local, remote: remote}
		}
	}
	return out, sc.Err()
}

// hexPort is the port of an address of /proc/net/tcp ("0100007F:1F90").
func hexPort(addr string) (int, error) {
	_, h, ok := strings.Cut(addr, ":")
	if !ok {
		return 0, fmt.Errorf("address %q", addr)
	}
	p, err := strconv.ParseUint(h, 16, 16)
	if err != nil {
		return 0, fmt.Errorf("address %q: %w", addr, err)
	}
	return int(p), nil
}
