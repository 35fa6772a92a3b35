package bench

import (
	"net"
	"os"
	"testing"
)

// TestClientPortOwners opens a real TCP connection from this process and
// checks that its client port is found as this process's, and that
// busByProcess charges that connection's traffic since before to it and
// leaves out a connection no process of ours holds.
func TestClientPortOwners(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	server := l.Addr().(*net.TCPAddr).Port
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	accepted, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer accepted.Close()
	client := c.LocalAddr().(*net.TCPAddr).Port

	self := os.Getpid()
	owners, err := clientPortOwners([]int{self}, server)
	if err != nil {
		t.Fatal(err)
	}
	if owners[client] != self {
		t.Fatalf("client port %d owned by %d, want this process %d (all: %v)", client, owners[client], self, owners)
	}
	// The accepted end's local port is the server's, connected to the
	// client's port, not to server: not a client of server.
	if _, ok := owners[server]; ok {
		t.Errorf("the listening side's port %d counted as a client of itself", server)
	}

	before := map[uint64]natsConn{1: {CID: 1, Port: client, InMsgs: 10, OutMsgs: 20, InBytes: 100, OutBytes: 200}}
	after := map[uint64]natsConn{
		1: {CID: 1, Port: client, InMsgs: 15, OutMsgs: 27, InBytes: 150, OutBytes: 270},
		2: {CID: 2, Port: 1, InMsgs: 99, OutMsgs: 99}, // no process of ours holds port 1
	}
	got, err := busByProcess(before, after, []int{self}, server)
	if err != nil {
		t.Fatal(err)
	}
	want := BusTraffic{InMsgs: 5, OutMsgs: 7, InBytes: 50, OutBytes: 70}
	if len(got) != 1 || got[self] != want {
		t.Errorf("busByProcess = %v, want only %d: %+v", got, self, want)
	}
}

func TestHexPort(t *testing.T) {
	for in, want := range map[string]int{"0100007F:1F90": 8080, "00000000000000000000000001000000:0016": 22} {
		if got, err := hexPort(in); err != nil || got != want {
			t.Errorf("hexPort(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"0100007F", "0100007F:XYZ", "0100007F:10000"} {
		if _, err := hexPort(bad); err == nil {
			t.Errorf("hexPort(%q) did not fail", bad)
		}
	}
}
