//! What a run reports: outcomes, progress lines and the summary, the soak table of `--repeat`, JUnit and ginkgo's JSON report;
//! reading such reports back, and merging the reports of a run's shards.

pub(crate) mod ginkgo_json;
pub(crate) mod json_report;
pub(crate) mod junit;
pub(crate) mod merge;
pub(crate) mod outcome;
pub(crate) mod progress;
pub(crate) mod rounds;
