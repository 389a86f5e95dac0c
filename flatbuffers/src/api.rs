//! API numbers and the versions this build speaks.

/// The APIs, by the number a frame carries. Numbers are never reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum Api {
    ApiVersions = 0,
    Metadata = 1,
    CreateQueue = 2,
    DeleteQueue = 3,
    AlterQueue = 4,
    DescribeQueue = 5,
    Produce = 6,
    Fetch = 7,
    ListOffsets = 8,
    JoinGroup = 9,
    Heartbeat = 10,
    LeaveGroup = 11,
    CommitOffsets = 12,
    FetchOffsets = 13,
    ListGroups = 14,
    DescribeGroup = 15,
    ResetGroup = 16,
    DeleteGroup = 17,
    Receive = 18,
    Settle = 19,
    /// Between brokers: the controller's Raft messages and forwarded proposals.
    Controller = 20,
    /// Between brokers: a follower fetches a partition from its leader.
    ReplicaFetch = 21,
    /// Node operations: a broker into or out of maintenance.
    DrainBroker = 22,
    /// The answering broker about itself (its disk).
    DescribeBroker = 23,
    /// Node operations: move every replica off a broker.
    DecommissionBroker = 24,
    /// Move a partition's replicas to other brokers.
    ReassignPartition = 25,
    /// Unclean leader elections of offline partitions (an operator accepts
    /// losing records).
    ElectLeaders = 26,
    /// Authentication: starts a SASL exchange (the mechanism).
    SaslHandshake = 27,
    /// Authentication: one SCRAM message each way.
    SaslAuthenticate = 28,
    /// Users: create one or replace its credentials.
    PutUser = 29,
    /// Users: delete one.
    DeleteUser = 30,
    /// Users: every user and its mechanisms.
    ListUsers = 31,
    /// ACLs: add or remove an entry.
    AlterAcls = 32,
    /// ACLs: every entry (or one user's).
    ListAcls = 33,
}

impl Api {
    /// Every API this build knows.
    pub const ALL: [Api; 34] = [
        Api::ApiVersions,
        Api::Metadata,
        Api::CreateQueue,
        Api::DeleteQueue,
        Api::AlterQueue,
        Api::DescribeQueue,
        Api::Produce,
        Api::Fetch,
        Api::ListOffsets,
        Api::JoinGroup,
        Api::Heartbeat,
        Api::LeaveGroup,
        Api::CommitOffsets,
        Api::FetchOffsets,
        Api::ListGroups,
        Api::DescribeGroup,
        Api::ResetGroup,
        Api::DeleteGroup,
        Api::Receive,
        Api::Settle,
        Api::Controller,
        Api::ReplicaFetch,
        Api::DrainBroker,
        Api::DescribeBroker,
        Api::DecommissionBroker,
        Api::ReassignPartition,
        Api::ElectLeaders,
        Api::SaslHandshake,
        Api::SaslAuthenticate,
        Api::PutUser,
        Api::DeleteUser,
        Api::ListUsers,
        Api::AlterAcls,
        Api::ListAcls,
    ];

    /// The API a frame's number names, if this build knows it.
    pub fn from_u16(n: u16) -> Option<Api> {
        Api::ALL.get(usize::from(n)).copied().filter(|a| *a as u16 == n)
    }

    /// Oldest and newest version of the API this build speaks.
    pub fn versions(self) -> (u16, u16) {
        (0, 0)
    }

    /// Whether this build speaks `version` of the API.
    pub fn supports(self, version: u16) -> bool {
        let (min, max) = self.versions();
        (min..=max).contains(&version)
    }

    pub fn name(self) -> &'static str {
        match self {
            Api::ApiVersions => "ApiVersions",
            Api::Metadata => "Metadata",
            Api::CreateQueue => "CreateQueue",
            Api::DeleteQueue => "DeleteQueue",
            Api::AlterQueue => "AlterQueue",
            Api::DescribeQueue => "DescribeQueue",
            Api::Produce => "Produce",
            Api::Fetch => "Fetch",
            Api::ListOffsets => "ListOffsets",
            Api::JoinGroup => "JoinGroup",
            Api::Heartbeat => "Heartbeat",
            Api::LeaveGroup => "LeaveGroup",
            Api::CommitOffsets => "CommitOffsets",
            Api::FetchOffsets => "FetchOffsets",
            Api::ListGroups => "ListGroups",
            Api::DescribeGroup => "DescribeGroup",
            Api::ResetGroup => "ResetGroup",
            Api::DeleteGroup => "DeleteGroup",
            Api::Receive => "Receive",
            Api::Settle => "Settle",
            Api::Controller => "Controller",
            Api::ReplicaFetch => "ReplicaFetch",
            Api::DrainBroker => "DrainBroker",
            Api::DescribeBroker => "DescribeBroker",
            Api::DecommissionBroker => "DecommissionBroker",
            Api::ReassignPartition => "ReassignPartition",
            Api::ElectLeaders => "ElectLeaders",
            Api::SaslHandshake => "SaslHandshake",
            Api::SaslAuthenticate => "SaslAuthenticate",
            Api::PutUser => "PutUser",
            Api::DeleteUser => "DeleteUser",
            Api::ListUsers => "ListUsers",
            Api::AlterAcls => "AlterAcls",
            Api::ListAcls => "ListAcls",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_round_trip() {
        for api in Api::ALL {
            assert_eq!(Api::from_u16(api as u16), Some(api));
        }
        assert_eq!(Api::from_u16(Api::ALL.len() as u16), None);
        assert_eq!(Api::from_u16(u16::MAX), None);
    }
}
