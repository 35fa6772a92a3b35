package promtext

import "testing"

func TestParse(t *testing.T) {
	text := `# HELP rest_client_requests_total Number of HTTP requests.
# TYPE rest_client_requests_total counter
rest_client_requests_total{code="200",host="127.0.0.1:6443",method="GET"} 12
rest_client_requests_total{code="201",host="127.0.0.1:6443",method="POST"} 3
rest_client_requests_total{code="200",host="127.0.0.1:6443",method="PATCH"} 2000
rest_client_requests_total{code="409",host="127.0.0.1:6443",method="PATCH"} 5
headwater_job_duration_seconds_sum{service="fetcher",type="io.headwater.job.fetch.requested.v1"} 1.5e+01
odd{label="a \"quoted\", value"} 1
plain 7 1700000000
`
	ss, err := Parse(text)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, metric string
		labels       []string
		want         map[string]float64
	}{
		{"by method", "rest_client_requests_total", []string{"method"}, map[string]float64{"GET": 12, "POST": 3, "PATCH": 2005}},
		{"by two labels", "rest_client_requests_total", []string{"method", "code"},
			map[string]float64{"GET/200": 12, "POST/201": 3, "PATCH/200": 2000, "PATCH/409": 5}},
		{"exponent", "headwater_job_duration_seconds_sum", []string{"type"}, map[string]float64{"io.headwater.job.fetch.requested.v1": 15}},
		{"escaped label", "odd", []string{"label"}, map[string]float64{`a "quoted", value`: 1}},
		{"no labels, timestamp", "plain", nil, map[string]float64{"": 7}},
		{"absent", "missing", []string{"x"}, map[string]float64{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ss.SumBy(tt.metric, tt.labels...)
			if len(got) != len(tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
			for k, v := range tt.want {
				if got[k] != v {
					t.Errorf("%s = %v, want %v (all: %v)", k, got[k], v, got)
				}
			}
		})
	}
}

func TestParseRejectsBadLines(t *testing.T) {
	for _, line := range []string{"novalue", `m{a="b"`, `m{a="b"} x`, `m{a} 1`} {
		if _, err := Parse(line + "\n"); err == nil {
			t.Errorf("%q parsed without error", line)
		}
	}
}

func TestSum(t *testing.T) {
	ss, err := Parse(`headwater_jobs_total{result="success",service="fetcher"} 4
headwater_jobs_total{result="success",service="fetcher-plugin"} 100
headwater_jobs_total{result="rejected",service="fetcher"} 2
headwater_jobs_total_other{result="success",service="fetcher"} 1000
headwater_source_condition{kind="GitRepository",name="a \"b\"",status="True"} 1
`)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name, metric string
		match        []string
		want         float64
	}{
		{"every sample", "headwater_jobs_total", nil, 106},
		{"one label, compared whole", "headwater_jobs_total", []string{`service="fetcher"`}, 6},
		{"two labels", "headwater_jobs_total", []string{`service="fetcher"`, `result="success"`}, 4},
		{"a prefix of a value matches nothing", "headwater_source_condition", []string{`kind="Git"`}, 0},
		{"escaped value", "headwater_source_condition", []string{`name="a \"b\""`}, 1},
		{"absent label", "headwater_jobs_total", []string{`shard="x"`}, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ss.Sum(tt.metric, tt.match...)
			if err != nil || got != tt.want {
				t.Errorf("Sum(%s, %q) = %v, %v; want %v", tt.metric, tt.match, got, err, tt.want)
			}
		})
	}
	if _, err := ss.Sum("headwater_jobs_total", `service=fetcher`); err == nil {
		t.Error("a match without quotes was accepted")
	}
}
